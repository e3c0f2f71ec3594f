"""On the GPU machine: ``proflab doctor`` says ok for torch CUDA, CUPTI, NVML and the GPU and
exits 0; and a program recorded there by ``proflab run`` exports a valid marked Perfetto trace
with the monitor's power on it. ``PROFLAB_GPU_ARTIFACTS=DIR`` keeps both outputs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tef_check

pytestmark = pytest.mark.gpu

SYNC_LOOP = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(2048, 4096), nn.GELU(), nn.Linear(4096, 2048)).cuda()
opt = torch.optim.AdamW(model.parameters(), foreach=True)
x = torch.randn(512, 2048, device="cuda")
for i in range(12):
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    print(f"step {i} loss {loss.item():.4f}", flush=True)   # a sync every step
"""


def _keep(path: Path) -> None:
    dest = os.environ.get("PROFLAB_GPU_ARTIFACTS")
    if dest:
        Path(dest).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(dest) / path.name)


def test_doctor_says_this_gpu_machine_can_profile(tmp_path):
    got = subprocess.run([sys.executable, "-m", "proflab", "doctor", "-f", "json", "--ncu-probe", "--dir", str(tmp_path / "runs"),
                          "-o", str(tmp_path / "doctor.json")], capture_output=True, text=True, timeout=600)
    doc = json.loads((tmp_path / "doctor.json").read_text())
    _keep(tmp_path / "doctor.json")
    c = {x["name"]: x for x in doc["checks"]}
    for name in ("torch", "torch CUDA build", "CUDA", "CUPTI", "NVML", "GPU", "run folder"):
        assert c[name]["status"] == "ok", (name, c[name])
    assert got.returncode == 0 and doc["can_profile"] is True, got.stderr
    import torch

    assert torch.version.cuda in c["torch CUDA build"]["detail"]
    assert torch.cuda.get_device_name(0) in c["GPU"]["detail"]
    if shutil.which("ncu"):
        assert c["ncu"]["status"] == "ok" and doc["facts"]["ncu"]["version"]
        # the probe either read the counters or was refused them and says how to fix it
        assert c["ncu probe"]["status"] == "ok" or "ERR_NVGPUCTRPERM" in c["ncu probe"]["detail"], c["ncu probe"]
    assert c["counter permission"]["status"] in ("ok", "warning")


def test_marked_perfetto_trace_of_a_program_recorded_here(tmp_path):
    prog = tmp_path / "sync_loop.py"
    prog.write_text(SYNC_LOOP)
    runs = tmp_path / "runs"
    got = subprocess.run([sys.executable, "-m", "proflab", "run", "--no-analyze", "--wait", "2", "--warmup", "1", "--active", "4",
                          "--monitor-period", "0.05", "-o", str(runs), "--", sys.executable, str(prog)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert got.returncode == 0, got.stderr[-3000:]
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    out = tmp_path / "sync_loop.perfetto.json.gz"
    got = subprocess.run([sys.executable, "-m", "proflab", "analyze", str(run_dir), "--perfetto", str(out), "-f", "json",
                          "-o", str(tmp_path / "analysis.json")], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    _keep(out)
    _keep(tmp_path / "analysis.json")
    doc = tef_check.load(out)
    assert tef_check.check(doc) == []
    report = json.loads((tmp_path / "analysis.json").read_text())
    report = report[0] if isinstance(report, list) else report
    marked = {e["args"]["finding"] for e in doc["traceEvents"] if str(e.get("cat", "")).startswith("proflab.finding")}
    assert marked == {f["id"] for f in report["findings"]}
    busy = [e["args"]["busy_pct"] for e in doc["traceEvents"] if e.get("ph") == "C" and "busy_pct" in e["args"]]
    assert busy and all(0 <= b <= 100 for b in busy)
    power = [e["args"]["power_w"] for e in doc["traceEvents"] if e.get("ph") == "C" and "power_w" in e["args"]]
    assert power, doc["otherData"]["proflab"]["notes"]
    gaps = [e for e in doc["traceEvents"] if e.get("cat") == "proflab.gap"]
    assert len(gaps) == sum(report["idle"]["gaps_by_cause"].values())
    steps = [e for e in doc["traceEvents"] if e.get("cat") == "proflab.step"]
    assert len(steps) == len(report["steps"]) >= 3
