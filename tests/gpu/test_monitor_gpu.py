"""The GPU monitor and ``proflab run`` on a real GPU (run on the GPU machine; skipped elsewhere).

Needs torch with CUDA, nvidia-ml-py and polars; not duckdb or jsonschema.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import proflab
from proflab.collect import monitor

pytestmark = pytest.mark.gpu

# NVML's power reading on A100/H100 is a one-second average and the energy counter is exact:
# over a few seconds of steady load the two integrals agree to a few percent; 15 % leaves room
# for the ramp at the start and the end.
ENERGY_TOLERANCE = 0.15


def test_monitor_during_a_cuda_loop(busy_gpu):
    assert monitor.available(), monitor.available().reason
    with proflab.GPUMonitor(period_s=0.1, devices=[0]) as mon:
        busy_gpu(5.0)
    s = mon.summary()
    df = mon.samples
    assert df.height >= 40, df.height  # ~50 ticks in 5 s at 100 ms
    for col in ("power_w", "energy_j", "sm_clock_mhz", "mem_clock_mhz", "temp_c", "util_gpu_pct", "mem_used_bytes"):
        assert df[col].null_count() == 0, col
    d = s.devices[0]
    assert d.mean_power_w > 100 and d.mean_util_gpu_pct > 50 and d.energy_source == "counter"
    # energy from the counter against power integrated over the same ticks
    assert d.energy_integrated_j == pytest.approx(d.energy_j, rel=ENERGY_TOLERANCE), (d.energy_j, d.energy_integrated_j)
    assert s.mean_sample_cost_ms < 20
    mon.stop()  # twice is fine
    print(json.dumps(s.to_dict(), indent=1))


def test_gpm_metrics_on_hopper(busy_gpu):
    import torch

    if torch.cuda.get_device_capability(0)[0] < 9:
        pytest.skip("GPM needs Hopper or later")
    with proflab.GPUMonitor(period_s=0.1, devices=[0]) as mon:
        busy_gpu(3.0)
    df = mon.samples.slice(1)  # the first row is taken before any GPM interval exists
    for col in ("gpm_sm_active_pct", "gpm_sm_occupancy_pct", "gpm_tensor_active_pct", "gpm_dram_bw_util_pct",
                "gpm_pcie_tx_mibps", "gpm_pcie_rx_mibps"):  # fmt: skip
        assert df[col].null_count() < df.height, f"{col} never sampled; errors: {mon.errors}"
    gpm = mon.summary().gpm
    assert gpm["gpm_sm_active_pct"] > 30 and gpm["gpm_tensor_active_pct"] > 5, gpm


TRAIN_CUDA = '''
import torch, torch.nn.functional as F
from torch import nn
model = nn.Sequential(nn.Linear(2048, 4096), nn.GELU(), nn.Linear(4096, 2048)).cuda()
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(256, 2048, device="cuda")
for i in range(30):
    loss = model(x).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
torch.cuda.synchronize()
print("done")
'''


def test_proflab_run_on_a_cuda_training_script(tmp_path):
    prog = tmp_path / "train_cuda.py"
    prog.write_text(TRAIN_CUDA)
    done = subprocess.run(
        [sys.executable, "-m", "proflab", "run", "-o", str(tmp_path / "runs"), "--", sys.executable, str(prog)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = next((tmp_path / "runs").iterdir())
    meta = json.loads((run / "meta.json").read_text())
    assert meta["gpu"]["available"] and meta["gpu"]["gpus"][0]["name"]
    assert meta["versions"]["torch_cuda"]
    assert meta["monitor"]["samples"] > 0 and meta["monitor"]["energy_j"] > 0
    trace = proflab.load(run / meta["traces"][0])
    assert trace.has_gpu and trace.steps.height == 5
    doc = json.loads((run / "analysis.json").read_text())
    assert doc["summary"]["gpu_busy_pct"] is not None and doc["kernels"]
    import polars as pl

    samples = pl.read_parquet(run / "monitor.parquet")
    assert samples.height == meta["monitor"]["samples"]
    assert "GPU monitor:" in done.stdout


def test_recorded_gpu_run_directory(data_dir: Path):
    """The committed GPU run (tests/data/runs/), once recorded with the command in its README."""
    runs = sorted((data_dir / "runs").glob("*/meta.json")) if (data_dir / "runs").is_dir() else []
    if not runs:
        pytest.skip("no recorded GPU run in tests/data/runs/ yet")
    run = runs[0].parent
    meta = json.loads(runs[0].read_text())
    assert meta["gpu"]["available"] and meta["monitor"]["energy_j"] > 0
    assert proflab.load(run / meta["traces"][0]).has_gpu
