"""A compiled program is recorded as it runs: ``proflab run`` leaves torch.compile as it is
(no de-compiling, no recompile, no graph break of its own), and records what Dynamo did.
Real runs on the CPU (Inductor's C++ backend), each program run plain and under proflab.

Needs torch (skipped where it is not installed)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

PROFLAB = [sys.executable, "-m", "proflab"]

# A compiled module (3 x Linear-LayerNorm-GELU), a loss under proflab.annotate outside it, a
# compiled function with a graph break, and a new batch size at step 6 (one recompile each).
PROG = '''
import json, os, sys
import torch
from torch import nn
import torch._dynamo.utils as du
import proflab
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU()) for _ in range(3)])
cmodel = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

@proflab.annotate("loss")
def loss_fn(out):
    return out.square().mean()

@torch.compile
def with_break(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return y.cos()

@torch.compile(fullgraph=True)
def annotated_inside(x):
    with proflab.annotate("inside"):  # an annotation in compiled code must not break its graph
        return x * 2

for i in range(int(sys.argv[1])):
    x = torch.randn(32 if i < 6 else 48, 64)
    loss = loss_fn(cmodel(x)) + with_break(x).sum() + annotated_inside(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("COUNTERS " + json.dumps({k: {str(a): int(b) for a, b in v.items()} for k, v in du.counters.items()
                                if k in ("frames", "stats", "graph_break", "recompiles")}, sort_keys=True), flush=True)
'''

# the counted step's matrix FLOPs (batch 32): forward 3 addmm; backward each weight's gradient
# and the input gradient of the two layers whose input needs one (the first layer's x does not)
LAYER = 2 * 32 * 64 * 64
STEP_GEMM = 3 * LAYER + 3 * LAYER + 2 * LAYER


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("compiled")
    prog = tmp / "prog.py"
    prog.write_text(PROG)
    plain = subprocess.run([sys.executable, str(prog), "10"], capture_output=True, text=True, timeout=600, cwd=tmp)
    assert plain.returncode == 0, plain.stderr
    done = subprocess.run([*PROFLAB, "run", "--no-analyze", "-o", str(tmp / "runs"), "--", sys.executable, str(prog), "10"],
                          capture_output=True, text=True, timeout=600, cwd=tmp)
    assert done.returncode == 0, done.stderr
    (run,) = [p for p in (tmp / "runs").iterdir() if p.is_dir()]
    return plain, done, run


def _counters(out: str) -> dict:
    (line,) = [x for x in out.splitlines() if x.startswith("COUNTERS ")]
    return json.loads(line[len("COUNTERS "):])


def _process(run: Path) -> dict:
    infos = [json.loads(p.read_text()) for p in (run / "processes").glob("*.json")]
    (info,) = [i for i in infos if i.get("traces")]
    return info


def test_the_trace_holds_the_compiled_regions_and_none_of_the_eager_autograd_they_replace(runs):
    _, _, run = runs
    (trace,) = (run / "traces").glob("*.pt.trace.json.gz")
    names = {e.get("name") for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]}
    assert any(n.startswith("Torch-Compiled Region") for n in names if n)
    assert {"CompiledFunction", "CompiledFunctionBackward"} <= names
    assert any(n.startswith("## Call CompiledFxGraph") for n in names if n)
    # the eager autograd nodes of the compiled module would be there had it run eager
    assert not names & {"AddmmBackward0", "NativeLayerNormBackward0", "GeluBackward0"}


def test_proflab_causes_no_recompile_no_graph_break_and_no_warning(runs):
    plain, done, _ = runs
    assert _counters(done.stdout) == _counters(plain.stdout)
    assert "global hooks on modules" not in done.stderr


def test_flops_of_the_compiled_step_are_counted_as_eager_would_count_them(runs):
    f = _process(runs[2])["flops"]
    assert f["source"].startswith("torch.utils.flop_counter") and not f["errors"]
    assert f["compiled"] is True and f["by_module"] == {} and "global module hooks" in f["by_module_missing"]
    assert f["by_op"]["aten.mm"] + f["by_op"]["aten.addmm"] == STEP_GEMM


def test_dynamos_record_of_breaks_and_recompiles_is_kept(runs):
    c = _process(runs[2])["compile"]
    assert c["source"].startswith("torch._dynamo")
    assert c["graph_break_count"] >= 1
    (brk,) = [b for b in c["graph_breaks"] if "graph_break()" in b["reason"]]
    at = next(i for i, line in enumerate(PROG.splitlines(), 1) if "graph_break()" in line)
    assert brk["lines"] == [f"{runs[0].args[1]}:{at}"]  # the graph_break() call's line
    # the new batch size recompiled the compiled module and both compiled functions' frames
    assert c["recompile_count"] >= 2 and all("size mismatch" in r["reason"] for r in c["recompiles"])
    assert c["cudagraph_skip_count"] == 0


def test_an_eager_program_has_no_compile_record_and_keeps_its_module_attribution(tmp_path):
    pytest.importorskip("torch")
    prog = tmp_path / "eager.py"
    prog.write_text(PROG.replace("cmodel = torch.compile(model)", "cmodel = model")
                    .replace("@torch.compile(fullgraph=True)", "").replace("@torch.compile", "")
                    .replace("torch._dynamo.graph_break()", "pass").replace("import torch._dynamo.utils as du", "du = None")
                    .replace('print("COUNTERS', 'print("DONE"); 0 and print("COUNTERS'))
    done = subprocess.run([*PROFLAB, "run", "--no-analyze", "-o", str(tmp_path / "runs"), "--", sys.executable, str(prog), "8"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    info = _process(run)
    assert info["compile"] is None
    f = info["flops"]
    assert f["compiled"] is False and f["by_module"]["Sequential"] == 3 * LAYER + 3 * LAYER + 2 * LAYER


def test_the_report_files_the_breaks_and_recompiles_with_their_lines(runs):
    from proflab.cli import main

    out = runs[2].parent / "report.json"
    assert main(["analyze", str(runs[2]), "--format", "json", "-o", str(out)]) in (0, 1)
    doc = json.loads(out.read_text())
    by = {f["category"]: f for f in doc["findings"]}
    brk, rec = by["graph_breaks"], by["recompiles"]
    assert brk["severity"] == "warning" and brk["evidence"]["graph_breaks"] >= 1
    assert brk["where"]["lines"] == [f"{runs[0].args[1]}:{next(i for i, x in enumerate(PROG.splitlines(), 1) if 'graph_break()' in x)}"]
    assert brk["prediction"]["model"] == "none" and brk["est_gain_ms"] == 0
    assert rec["evidence"]["recompiles"] >= 2 and "size mismatch" in rec["title"]
    assert doc["summary"]["compiled"]["record"]["graph_break_count"] == brk["evidence"]["graph_breaks"]


# A compiled function whose backend counts the calls its compiled code serves: a recorder that
# turned compilation off would leave the count short of the calls the program made.
COUNTING = '''
import json, sys
import torch
import proflab
served = [0]
def backend(gm, inputs):
    def run(*args):
        served[0] += 1
        return gm.forward(*args)
    return run
w = torch.randn(32, 32, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.01)
@torch.compile(backend=backend)
def f(x):
    return (x @ w).relu().sum()
def train(n):
    for _ in range(n):
        f(torch.randn(8, 32)).backward()
        opt.step()
        opt.zero_grad()
        proflab.step()
if sys.argv[1] == "profile":
    with proflab.profile("block", wait=1, warmup=1, active=2) as run:
        train(8)
    names = {e.get("name") for t in run.traces for e in json.loads(__import__("gzip").open(t).read())["traceEvents"]}
    print("REGION", any(str(n).startswith("Torch-Compiled Region") for n in names), flush=True)
else:
    train(int(sys.argv[1]))
print("SERVED", served[0], flush=True)
'''


def test_a_profiled_block_and_trys_timed_runs_keep_the_program_compiled(tmp_path):
    """The other ways proflab records a program: ``proflab.profile()`` in the program's own
    process, and ``proflab try``'s timed runs (each run's steps timed by the runtime)."""
    pytest.importorskip("torch")
    prog = tmp_path / "counting.py"
    prog.write_text(COUNTING)
    block = subprocess.run([sys.executable, str(prog), "profile"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert block.returncode == 0, block.stderr
    assert "REGION True" in block.stdout and "SERVED 8" in block.stdout
    tried = subprocess.run([*PROFLAB, "try", "tf32", "--no-predict", "--rounds", "1", "--max-rounds", "1", "-o", str(tmp_path / "runs"),
                            "--", sys.executable, str(prog), "12"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert tried.returncode == 0, tried.stderr
    assert tried.stdout.count("SERVED 12") == 2, tried.stdout  # the run as it is and the run with the knob
