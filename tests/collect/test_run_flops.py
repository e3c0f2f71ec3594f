"""``proflab run`` counts one unprofiled step's FLOPs (torch.utils.flop_counter), so that a
trace recorded without shapes still has its FLOPs per step: real runs on the CPU.

Needs torch (skipped where it is not installed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import proflab

PROFLAB = [sys.executable, "-m", "proflab"]

# an MLP (128 -> 256 -> 10, batch 64) with a causal attention in front of its first layer
PROG = '''
import sys
import torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
q = torch.randn(2, 4, 32, 16, requires_grad=True)
for i in range(int(sys.argv[1])):
    a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    loss = F.cross_entropy(model(x + a.sum()), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done", flush=True)
'''

GEMM = 2 * 64 * 128 * 256 + 2 * 64 * 256 * 10  # forward; the backward twice that (the input needs its gradient: q's)
STEP_GEMM = 3 * GEMM


@pytest.fixture
def torch_required():
    pytest.importorskip("torch")


def _run(tmp_path: Path, *args: str) -> Path:
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    done = subprocess.run([*PROFLAB, "run", "--no-analyze", "-o", str(tmp_path / "runs"), *args, "--", sys.executable, str(prog), "14"],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    return run


def _process(run: Path) -> dict:
    (p,) = (run / "processes").glob("*.json")
    return json.loads(p.read_text())


def test_one_unprofiled_step_is_counted_and_gives_the_trace_its_flops(tmp_path, torch_required):
    run = _run(tmp_path)
    info = _process(run)
    f = info["flops"]
    # the program's second step: the profiler's schedule still waits (3 steps), nothing records
    assert f["source"].startswith("torch.utils.flop_counter") and f["step"] == 2 and not f["errors"]
    assert f["by_op"]["aten.mm"] + f["by_op"]["aten.addmm"] == STEP_GEMM
    assert f["by_dtype"] == {"torch.float32": f["total"]} and f["matmul_tf32"] is False
    assert f["by_module"]["Sequential"] == STEP_GEMM and f["by_module"]["Sequential.0"] > f["by_module"]["Sequential.2"]
    # the counted step is no bare step time (step 2 is inside the program's first 3 anyway)
    assert info["step_times"]["bare_n"] >= 3
    # the trace, recorded without shapes, takes its FLOPs per step from the count
    trace = proflab.load(next((run / "traces").glob("*.pt.trace.json.gz")))
    assert trace.cpu["input_dims"].null_count() == trace.cpu.height  # (recorded without shapes)
    p = proflab.analyze(trace).perf
    assert p["flop_source"].startswith("torch.utils.flop_counter") and p["per_step"]["model_flops"] == f["total"]
    assert {c["class"]: c["flops"] for c in p["classes"]}["gemm"] == STEP_GEMM * p["per_step"]["steps"]


def test_count_flops_off(tmp_path, torch_required):
    run = _run(tmp_path, "--no-count-flops")
    assert _process(run)["flops"] is None
    assert json.loads((run / "meta.json").read_text())["options"]["count_flops"] is False


def test_with_shapes_the_trace_gives_the_same_matrix_flops(tmp_path, torch_required):
    """--record-shapes: the trace's own shapes count the step as flop_counter did (and the
    CPU's fused causal attention, which flop_counter has no formula for, besides)."""
    run = _run(tmp_path, "--record-shapes")
    f = _process(run)["flops"]
    p = proflab.analyze(next((run / "traces").glob("*.pt.trace.json.gz"))).perf
    assert p["flop_source"].startswith("shapes")
    classes = {c["class"]: c for c in p["classes"]}
    steps = p["per_step"]["steps"]
    assert classes["gemm"]["flops"] == steps * (f["by_op"]["aten.mm"] + f["by_op"]["aten.addmm"])
    pairs = 2 * 4 * 32 * 32  # (batch, heads, queries, keys)
    assert classes["attention"]["flops"] == steps * (2 * pairs * (16 + 16) + 2 * pairs * (3 * 16 + 2 * 16))


def test_without_wait_steps_the_step_after_the_window_is_counted(tmp_path, torch_required):
    """--wait 0: the schedule records from the first step, so the count waits for the window
    to close (warm-up 1 and 5 active steps: the interval after the 6th step)."""
    f = _process(_run(tmp_path, "--wait", "0"))["flops"]
    assert f["step"] == 7 and f["by_op"]["aten.mm"] + f["by_op"]["aten.addmm"] == STEP_GEMM
