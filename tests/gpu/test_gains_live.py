"""Gains that hold, on a GPU: fixes made for real and measured against their prediction.

- ``proflab try`` makes a knob fix on an unmodified program (TF32 on an FP32 MLP, a fused
  optimizer on a per-parameter AdamW loop): the measured saving, interleaved runs with its 95 %
  interval, must meet the prediction of the finding that names the knob (from the profiled run
  ``try`` makes first) within the target of ``benchmarks/gains_truth.py`` (15 % of the step).
- The gain-truth recorder re-measures two of its programs here, and each prediction from the
  fresh trace must meet the fresh measurement.

    python -m pytest -q tests/gpu/test_gains_live.py      # on the GPU machine, ~4 min
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import proflab

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
PROFLAB = [sys.executable, "-m", "proflab"]

FP32_MLP = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(4096, 4096), torch.nn.ReLU())]).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(4096, 4096, device="cuda")
for _ in range(40):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
"""

PER_PARAMETER = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(*[m for _ in range(24) for m in (torch.nn.Linear(256, 256), torch.nn.GELU())]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
x = torch.randn(64, 256, device="cuda")
for _ in range(120):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
"""


@pytest.mark.parametrize("knob,program", [("tf32", FP32_MLP), ("fused-optimizer", PER_PARAMETER)])
def test_proflab_try_measures_what_the_finding_predicted(tmp_path, knob, program):
    prog = tmp_path / "prog.py"
    prog.write_text(program)
    done = subprocess.run(
        [*PROFLAB, "try", knob, "--rounds", "2", "--max-rounds", "4", "-f", "json", "-o", str(tmp_path / "runs"),
         "--", sys.executable, str(prog)],
        capture_output=True, text=True, timeout=420, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    t = json.loads(done.stdout[done.stdout.index("{"):])
    assert t["clock"] == "gpu" and t["verdict"] == "faster", t
    p = t["predicted"]
    assert p["finding"] is not None and p["model"] == "replay", p
    measured_ms = t["base_ms"] - t["fix_ms"]
    assert abs(p["predicted_gain_ms"] - measured_ms) <= 0.15 * t["base_ms"], (p, measured_ms, t["base_ms"])


def test_the_recorder_s_fresh_measurements_meet_the_fresh_predictions(tmp_path):
    out = tmp_path / "gains"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "data" / "record" / "record_gains.py"), "--out", str(out),
         "--only", "tf32_mlp", "pageable_h2d"], capture_output=True, text=True, timeout=420,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    truth = json.loads((out / "truth.json").read_text())["programs"]
    for name, fix, finding in (("tf32_mlp", "tf32", "tensor_cores_unused"), ("pageable_h2d", "pinned", "pageable_memcpy")):
        t = truth[name]
        base = t["bare"]["base"]["median_ms"]
        report = proflab.analyze(out / f"{name}.base.pt.trace.json.gz", bare_step_ms=base)
        (f,) = [f for f in report.findings if f.id == finding]
        assert abs(f.est_gain_ms - t["measured"][fix]["gain_ms"]) <= 0.15 * base, (name, f.est_gain_ms, t["measured"][fix])
