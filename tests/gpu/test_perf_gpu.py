"""Where the FLOPs go, on the GPU machine: a GEMM, convolution and attention workload recorded
here with shapes, its FLOPs from the trace against ``torch.utils.flop_counter``'s count of
one step of the same program (within 2 % per class), and, where ncu is on the PATH, the
GEMM kernels' achieved TFLOPS from the trace against Nsight Compute's durations of the same
kernels in an unprofiled run (within 10 %). Bounded: about a minute on an H100/H200.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import proflab
from proflab.analysis.context import Context
from proflab.analysis.perf import perf_for
from proflab.analysis.perf.table import operator_table

pytestmark = pytest.mark.gpu
needs_ncu = pytest.mark.skipif(shutil.which("ncu") is None, reason="ncu is not on the PATH")

PROGRAM = '''
import json, sys
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

torch.manual_seed(0)
dev = "cuda"
lin = nn.Linear(2048, 2048).to(dev)
conv = nn.Conv2d(64, 128, 3, stride=2, padding=1).to(dev, memory_format=torch.channels_last)
x = torch.randn(4096, 2048, device=dev)
img = torch.randn(32, 64, 64, 64, device=dev).contiguous(memory_format=torch.channels_last)
q, k, v = (torch.randn(8, 16, 1024, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
opt = torch.optim.AdamW([*lin.parameters(), *conv.parameters()], lr=1e-4, fused=True)

def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = lin(x).float().square().mean() + conv(img).float().square().mean()
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    (y + a.float().square().mean()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

mode, out = sys.argv[1], sys.argv[2]
for _ in range(5):
    step()
torch.cuda.synchronize()
if mode == "steps":  # under ncu: just the steps
    for _ in range(int(out)):
        step()
    torch.cuda.synchronize()
    sys.exit(0)
from torch.utils.flop_counter import FlopCounterMode
with FlopCounterMode(display=False) as fc:
    step()
torch.cuda.synchronize()
by_op = {str(o): int(n) for o, n in fc.get_flop_counts()["Global"].items()}
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
             schedule=schedule(wait=1, warmup=1, active=5), on_trace_ready=lambda p: p.export_chrome_trace(out + "/t.pt.trace.json")) as prof:
    for _ in range(7):
        step()
        prof.step()
torch.cuda.synchronize()
json.dump({"by_op": by_op, "total": fc.get_total_flops(), "gpu": torch.cuda.get_device_name(0)}, open(out + "/truth.json", "w"))
'''
GEMM_KERNELS = r"nvjet|gemm|xmma|cutlass|s1688|s16816|Kernel2"


def _base(name: str) -> str:
    """A kernel's name without ``void`` and its parameter list: ncu and CUPTI may print those
    differently; the name and its template arguments are the same."""
    name = name.removeprefix("void ").strip()
    return name[: name.rfind("(")] if name.endswith(")") and "(" in name else name


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("perf")
    prog = out / "prog.py"
    prog.write_text(PROGRAM)
    subprocess.run([sys.executable, str(prog), "trace", str(out)], check=True, timeout=120)
    return prog, out, json.loads((out / "truth.json").read_text())


def test_flops_per_class_against_flop_counter(recorded):
    _, out, truth = recorded
    p = perf_for(Context(proflab.load(out / "t.pt.trace.json", cache=False)))
    per_step = {r["cls"]: r["flops"] / p.steps.height for r in p.classes().iter_rows(named=True) if r["flops"] is not None}
    by = truth["by_op"]
    expect = {
        "gemm": sum(v for o, v in by.items() if o in ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm")),
        "conv": sum(v for o, v in by.items() if "convolution" in o),
        "attention": sum(v for o, v in by.items() if "attention" in o),
    }
    assert all(expect.values()), by
    for cls, n in expect.items():
        assert per_step[cls] == pytest.approx(n, rel=0.02), cls
    d = p.to_dict()
    assert d["coverage"]["modelled_pct"] > 90
    if d["peaks"] is not None:  # a GPU the datasheet table knows
        assert d["per_step"]["mfu_pct"] and 0 < d["per_step"]["mfu_pct"] < 100
        assert {c["class"]: c for c in d["classes"]}["gemm"]["bound"] == "compute"


@needs_ncu
def test_gemm_achieved_tflops_against_nsight_compute(recorded, tmp_path):
    """The unprofiled program's GEMM kernels under ncu (20 launches past the warm-up) found
    in the trace's own sequence of GEMM kernels; each kernel's FLOPs (its operator's shapes)
    over the trace's duration and over ncu's: within 10 %."""
    prog, out, _ = recorded
    done = subprocess.run(["ncu", "--clock-control", "none", "--csv", "--page", "raw", "--metrics", "gpu__time_duration.sum",
                           "--kernel-name", f"regex:{GEMM_KERNELS}", "--launch-skip", "40", "--launch-count", "20",
                           sys.executable, str(prog), "steps", "12"], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = list(csv.DictReader(io.StringIO("\n".join(ln for ln in done.stdout.splitlines() if not ln.startswith("==")))))
    rows = [r for r in rows[1:] if r.get("ID")]
    assert len(rows) == 20
    tr = proflab.load(out / "t.pt.trace.json", cache=False)
    ctx = Context(tr)
    calls = operator_table(tr, ctx.launches).ops.filter(pl.col("cls") == "gemm")
    k = (tr.kernels.join(ctx.launches.select("correlation", "tid", "launch_start_ns"), on="correlation")
         .filter(pl.col("name").str.contains(GEMM_KERNELS)).sort("start_ns")
         .with_columns(pl.format("({}, {}, {})", "grid_x", "grid_y", "grid_z").alias("grid"))
         .with_row_index("_i").sort("launch_start_ns")
         .join_asof(calls.select("tid", "start_ns", "end_ns", "exec_flops").sort("start_ns"), left_on="launch_start_ns",
                    right_on="start_ns", by="tid", check_sortedness=False)
         .with_columns(pl.when(pl.col("launch_start_ns") < pl.col("end_ns")).then(pl.col("exec_flops")).alias("exec_flops"))
         .sort("_i"))  # fmt: skip
    seq = [(_base(r["Kernel Name"]), r["Grid Size"]) for r in rows]
    trace = list(zip(map(_base, k["name"].to_list()), k["grid"].to_list()))
    at = [i for i in range(len(trace) - len(seq) + 1) if trace[i:i + len(seq)] == seq]
    assert at, "ncu's kernel sequence is not in the trace's"
    flops, durs = k["exec_flops"].to_list(), k["dur_ns"].to_list()
    compared = 0
    for n, r in enumerate(rows):
        fs = {flops[i + n] for i in at}
        if None in fs or len(fs) != 1:
            continue  # (a kernel outside a GEMM operator, or of several problem sizes)
        (f,) = fs
        trace_ns = sorted(durs[i + n] for i in at)[len(at) // 2]
        ncu_ns = float(r["gpu__time_duration.sum"].replace(",", ""))
        assert f / trace_ns == pytest.approx(f / ncu_ns, rel=0.10), r["Kernel Name"]
        compared += 1
    assert compared >= 5
