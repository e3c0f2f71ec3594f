"""``proflab run`` on real GPU programs: every kind of program records its step window, and
the program runs at its bare speed after the window.

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_run_live.py``. Each test profiles an
unmodified program in a real subprocess; the programs are the shapes that missed before:
torch.compile, fused AdamW + SDPA with a slow import under way when the time window is due,
a 30 s build before the first step, the Hugging Face Trainer, and torchrun with 2 processes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import proflab

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "examples" / "gpt_train.py"
PROFLAB = [sys.executable, "-m", "proflab", "run", "--no-analyze"]
_HAS_POLARS = importlib.util.find_spec("polars") is not None

COMPILED = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
opt = torch.optim.AdamW(model.parameters(), fused=True)
cm = torch.compile(model)
x = torch.randn(256, 1024, device="cuda")
for i in range(14):
    loss = cm(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print("done", flush=True)
"""

# The time window is due (--delay 1) while the program is inside a 3 s import that itself
# imports torch._dynamo: the profiler must wait for the import to end, then the step window
# of the fused-AdamW + SDPA GPT records.
SLOW_IMPORT_MODULE = """
import time
t = time.monotonic()
while time.monotonic() - t < 3.0:
    sum(i * i for i in range(10000))
import torch._dynamo
"""
LM_WITH_SLOW_IMPORT = f"""
import runpy, sys
import torch
import slowmod
sys.argv = [{str(GPT)!r}, "--fused", "--iters", "14"]
runpy.run_path({str(GPT)!r}, run_name="__main__")
"""

HF_TRAINER = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 512
    def __getitem__(self, i):
        ids = torch.randint(0, 1000, (128,))
        return {"input_ids": ids, "labels": ids}

model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=1000, n_positions=128))
args = TrainingArguments(output_dir="hf_out", max_steps=14, per_device_train_batch_size=16, report_to=[],
                         logging_steps=1000, save_strategy="no", disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=Tokens()).train()
print("done", flush=True)
"""

# Two processes on one GPU: NCCL refuses two ranks on one device, so the ranks talk over
# gloo (which all-reduces CUDA tensors through the host); each rank's step window is its
# own optimizer's steps, as under NCCL.
DDP_GLOO = """
import os
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.cuda.set_device(0)
torch.manual_seed(dist.get_rank())
model = DDP(nn.Sequential(nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, 1024)).cuda(), device_ids=[0])
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(256, 1024, device="cuda")
for step in range(14):
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
dist.destroy_process_group()
print("done", flush=True)
"""


# One tiny kernel replayed from a CUDA graph, timed on the GPU before and after a stretch of
# Python work that makes no CUDA call, after which the program runs a torch.profiler session of
# its own. With ``first`` the program itself first runs a session over the start of that
# stretch (plain torch, the control); under ``proflab run --window time`` proflab's time
# window does. Kineto tears CUPTI down on the first CUDA runtime call after a stop: with none
# before the next session starts, the teardown is lost and kernel tracing stays on.
GRAPH_AFTER_IDLE_STOP = """
import json, sys, time
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, BENCHMARKS)
from probe_profiler_residue import graph_kernel_timer

kernel_us = graph_kernel_timer(torch, repeats=15)
x = torch.zeros(1, device="cuda")

def busy(s):  # Python work: no CUDA call
    t = time.monotonic()
    while time.monotonic() - t < s:
        sum(i * i for i in range(20000))

before = kernel_us()
profiled_before = torch.autograd.profiler._is_profiler_enabled  # must be False: a clean baseline
if sys.argv[1] == "first":
    p = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    p.start()
    for _ in range(20):
        x.add_(1)
    p.stop()
    p.export_chrome_trace("first.json")
busy(float(sys.argv[2]))
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    for _ in range(20):
        x.add_(1)
    torch.cuda.synchronize()
print(json.dumps({"before_us": before, "after_us": kernel_us(), "profiled_before": profiled_before}), flush=True)
""".replace("BENCHMARKS", repr(str(ROOT / "benchmarks")))


# The whole flow of a default run over a slow start-up: the time-window fallback starts during
# it (--delay 3), steps come, the step window records and closes; then the graph kernel again.
GRAPH_AROUND_A_RUN = GRAPH_AFTER_IDLE_STOP.split("before = kernel_us()")[0] + """
before = kernel_us()
profiled_before = torch.autograd.profiler._is_profiler_enabled
busy(5.0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
opt = torch.optim.AdamW(model.parameters())
inp = torch.randn(64, 512, device="cuda")
for i in range(50):
    model(inp).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if i == 20:  # the fallback is over, the step window (--wait 30) not yet begun
        between = kernel_us()
torch.cuda.synchronize()
print(json.dumps({"before_us": before, "between_us": between, "after_us": kernel_us(), "profiled_before": profiled_before}), flush=True)
"""


def _last_json(out: str) -> dict:
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def test_a_session_right_after_the_window_does_not_keep_kernel_tracing_on(tmp_path):
    (tmp_path / "prog.py").write_text(GRAPH_AFTER_IDLE_STOP)
    env = {**os.environ, "TEARDOWN_CUPTI": "1"}  # what proflab run sets
    plain = subprocess.run([sys.executable, "prog.py", "first", "1"], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path, env=env)  # fmt: skip
    assert plain.returncode == 0, plain.stderr[-3000:]
    control = _last_json(plain.stdout)
    lost = control["after_us"] / control["before_us"]
    # the time window starts 3 s after the torch import and lasts 1 s, inside 6 s of Python work
    run, stdout = _run_and_read(
        tmp_path, [sys.executable, "prog.py", "proflab", "6"], "--window", "time", "--delay", "3", "--duration", "1"
    )
    meta = json.loads((run / "meta.json").read_text())
    assert meta["recorded"], meta["notes"]
    out = _last_json(stdout)
    print(f"graph kernel: plain torch {control}, x{lost:.2f}; under proflab run {out}")
    assert out["profiled_before"] is False and control["profiled_before"] is False, (out, control)
    ratio = out["after_us"] / out["before_us"]
    if lost < 1.15:
        pytest.skip(f"this torch no longer loses the teardown (plain torch x{lost:.2f}); under proflab x{ratio:.2f}")
    assert ratio < 1.05, (out, meta["notes"])


def test_after_a_run_with_a_fallback_and_a_step_window_kernel_tracing_is_off(tmp_path):
    # the mechanism behind the after-window residue, without the host noise of step times:
    # 1.22-1.51x on a graph kernel whenever CUPTI stayed on (no teardown, or a lost one)
    (tmp_path / "prog.py").write_text(GRAPH_AROUND_A_RUN)
    run, stdout = _run_and_read(tmp_path, [sys.executable, "prog.py"], "--delay", "3", "--wait", "30")
    meta = json.loads((run / "meta.json").read_text())
    assert meta["recorded"] and any("recorded the step window instead" in n for n in meta["notes"]), meta["notes"]
    out = _last_json(stdout)
    assert out["profiled_before"] is False, out
    between, ratio = out["between_us"] / out["before_us"], out["after_us"] / out["before_us"]
    print(f"graph kernel around a run with a fallback and a step window: {out}, x{between:.2f} between, x{ratio:.2f} after")
    assert between < 1.05 and ratio < 1.05, (out, meta["notes"])


# A CUDA graph captured the moment the step window closes (its 9th step: wait 3, warm-up 1,
# active 5), while proflab's thread makes its CUDA calls for Kineto's teardown: a call that is
# not allowed during a capture (in torch's default "global" mode, from any thread) would make
# the capture fail: with a stream query in place of cudaGetDevice this test failed on an H100
# (cudaErrorStreamCaptureInvalidated); with cudaGetDevice it passes.
GRAPH_CAPTURED_AS_THE_WINDOW_CLOSES = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 1024)).cuda()
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(256, 1024, device="cuda")
for _ in range(9):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
static_x = torch.randn(256, 1024, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.no_grad(), torch.cuda.stream(side):
    for _ in range(3):
        model(static_x)
torch.cuda.current_stream().wait_stream(side)
with torch.no_grad():
    for _ in range(20):  # captured again and again over the 0.15 s of proflab's calls
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_y = model(static_x)
        g.replay()
    torch.cuda.synchronize()
    assert torch.allclose(static_y, model(static_x), atol=1e-5), "the replayed graph gave another result"
print("graph ok", flush=True)
"""


def test_a_cuda_graph_captured_as_the_window_closes(tmp_path):
    (tmp_path / "prog.py").write_text(GRAPH_CAPTURED_AS_THE_WINDOW_CLOSES)
    meta = _assert_step_windows(_run(tmp_path, [sys.executable, "prog.py"], "--window", "steps"))
    assert any("window's end held" in n for n in meta["notes"]), meta["notes"]


# A loop whose host enqueues a step in a fraction of the time its GPU runs it, and never
# waits for it (no .item(), no synchronize; fewer kernels over the run than the launch queue
# holds): the host's step-to-step time is its enqueue time, not the loop's pace. The program
# times its own steps between CUDA events (the ground truth); proflab run's unprofiled step
# must be the GPU's, not the host's. Before GpuStepClock it was the host's: a fraction of it.
HOST_AHEAD = """
import json
import torch

torch.backends.cuda.matmul.allow_tf32 = False
w = torch.nn.Parameter(torch.randn(4096, 4096, device="cuda"))
opt = torch.optim.SGD([w], lr=1e-9)
x = torch.randn(4096, 4096, device="cuda")
marks = [torch.cuda.Event(enable_timing=True) for _ in range(41)]
for i in range(40):
    marks[i].record()
    (x @ w).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
marks[40].record()
torch.cuda.synchronize()
print("TIMES " + json.dumps([a.elapsed_time(b) for a, b in zip(marks, marks[1:])]), flush=True)
"""


def test_the_unprofiled_step_is_the_gpus_when_the_host_runs_ahead(tmp_path):
    import statistics

    (tmp_path / "prog.py").write_text(HOST_AHEAD)
    run, out = _run_and_read(tmp_path, [sys.executable, "prog.py"], "--window", "steps")
    times = json.loads(next(line for line in out.splitlines() if line.startswith("TIMES "))[6:])
    truth = statistics.median(times[12:])  # after the window (steps 4-9) and the save
    (proc,) = [p for p in json.loads((run / "meta.json").read_text())["processes"] if p.get("step_times", {}).get("bare_n")]
    st = proc["step_times"]
    print(f"program's GPU-side median {truth:.3f} ms; proflab: {st}")
    assert st["clock"] == "gpu", st
    assert st["bare_ms"] == pytest.approx(truth, rel=0.05), (truth, st)
    assert st["host_bare_ms"] < 0.5 * truth, (truth, st)  # what the host's clock said: its enqueue time


def _run(tmp_path: Path, prog: list[str], *opts: str, timeout: int = 600) -> Path:
    return _run_and_read(tmp_path, prog, *opts, timeout=timeout)[0]


def _run_and_read(tmp_path: Path, prog: list[str], *opts: str, timeout: int = 600) -> tuple[Path, str]:
    """The run directory of ``proflab run`` over ``prog``, and what the program printed."""
    done = subprocess.run(
        [*PROFLAB, "-o", str(tmp_path / "runs"), *opts, "--", *prog],
        capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    runs = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0], done.stdout


def _assert_step_windows(run: Path, traces: int = 1) -> dict:
    meta = json.loads((run / "meta.json").read_text())
    assert meta["recorded"] is True, meta["why_no_trace"]
    assert len(meta["traces"]) == traces, meta
    for t in meta["traces"]:
        assert (run / t).stat().st_size > 0, t
        if not _HAS_POLARS:  # reading the trace back is the analysis's part, which needs polars
            continue
        trace = proflab.load(run / t)
        assert trace.steps.height == 5, (t, trace.steps.height, meta["notes"])  # --active 5
        assert trace.kernels.height > 0, t  # CUPTI recorded the GPU side
    assert not any("failed" in n for n in meta["notes"]), meta["notes"]
    return meta


def test_torch_compile_records_its_window(tmp_path):
    (tmp_path / "prog.py").write_text(COMPILED)
    _assert_step_windows(_run(tmp_path, [sys.executable, "prog.py"], "--delay", "2"))


def test_fused_adamw_sdpa_waits_out_an_import_in_progress(tmp_path):
    (tmp_path / "slowmod.py").write_text(SLOW_IMPORT_MODULE)
    (tmp_path / "prog.py").write_text(LM_WITH_SLOW_IMPORT)
    meta = _assert_step_windows(_run(tmp_path, [sys.executable, "prog.py"], "--delay", "1"))
    (proc,) = [p for p in meta["processes"] if p.get("profiled")]
    # the timer came due about 2 s into the 3 s import and waited for its end
    assert proc["time_window_waited_s"] > 0.5, proc
    assert "an import was in progress" in proc["time_window_waited_for"], proc


def test_a_30_s_build_before_the_first_step_still_gets_its_steps(tmp_path):
    # default --delay 5 --duration 10: the fallback window (5-15 s) is over long before the
    # first step, which comes at 30 s
    meta = _assert_step_windows(_run(tmp_path, [sys.executable, str(GPT), "--startup-s", "30", "--iters", "14"]))
    assert any("recorded the step window instead" in n for n in meta["notes"]), meta["notes"]


def test_hf_trainer_records_its_window(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "prog.py").write_text(HF_TRAINER)
    _assert_step_windows(_run(tmp_path, [sys.executable, "prog.py"]))


def test_torchrun_two_processes_each_record_a_window(tmp_path):
    (tmp_path / "prog.py").write_text(DDP_GLOO)
    prog = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "prog.py"]
    meta = _assert_step_windows(_run(tmp_path, prog), traces=2)
    assert sorted(t.split("/")[-1][:5] for t in meta["traces"]) == ["rank0", "rank1"], meta["traces"]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_run_overhead", ROOT / "benchmarks" / "bench_run_overhead.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Step times are the benchmark's (bench_run_overhead.py, README "Interleaved runs" and "Within
# one process"), not these tests': on the H100 of one call (this project's records) bare
# processes of the GPT script ran 12.7-19.2 ms per iteration after iteration 90, profiled
# ones 12.8-20.5, and a bare process drifted from 16.1 to 19.2 ms inside itself; the faster of
# two profiled runs against the median of three bare ones came out 1.13x, 1.26x and 0.99x in
# three runs of one test, and a profiled process's after/before ratio 0.91-1.16 with nothing
# left on (and 1.53x in a later call, where a host probe of CPU-side op dispatch jumped from
# 3.0-3.6 to 5.5-6.2 us per op partway through bare processes as well, and the graph kernel
# stayed at 1.02 us). Margins of 10-15 % on such figures failed with no residue, so these two tests check
# the runs themselves, and print the step times. The residue they were written against
# (1.26-1.48x, kernel tracing left on after a dropped fallback) is held to within 5 % of GPU
# time by the graph-kernel tests above, which time one kernel with CUDA events: no host noise.
def test_eager_runs_with_a_dropped_fallback_record_their_step_window(tmp_path):
    """The case that left eager runs 15-26 % slower: the time-window fallback starts during a
    slow start-up and is dropped for the step window. Bare and profiled runs alternate (three
    and two); each profiled run records its step window after dropping the fallback, and the
    after-window medians are printed beside the bare runs'."""
    bench = _bench()
    bare, prof = [], []
    for i, profiled in enumerate((False, True, False, True, False)):
        if profiled:
            (root := tmp_path / f"run{i}").mkdir()
            run = bench.run_once("eager", ["--delay", "1"], iters=120, startup_s=3.0, root=str(root))
            assert run["meta"]["recorded"], run["meta"]["notes"]
            assert any("recorded the step window instead" in n for n in run["meta"]["notes"]), run["meta"]["notes"]
            prof.append(bench.medians(run["iter_ms"])["after_ms"])
        else:
            bare.append(bench.medians(bench.run_once("eager", None, iters=120, startup_s=3.0)["iter_ms"])["after_ms"])
    assert len(bare) == 3 and len(prof) == 2 and all(t > 0 for t in bare + prof)
    ratio = min(prof) / sorted(bare)[1]
    print(f"after the window: profiled {[round(p, 2) for p in prof]} ms, bare {[round(b, 2) for b in bare]} ms, x{ratio:.3f}")


@pytest.mark.parametrize("fallback", [False, True], ids=["step-window", "fallback-dropped"])
def test_a_run_records_its_step_window_after_sixty_steps(tmp_path, fallback):
    """The GPT script for 240 iterations under ``proflab run --wait 60``: the step window comes
    after 60 steps (with the fallback variant, a time-window profiler was also started during a
    slow start-up and dropped before them), every iteration is timed, and the medians before
    (20-57) and after (90-) the window are printed."""
    bench = _bench()
    opts = ["--wait", "60"] + (["--delay", "1"] if fallback else ["--window", "steps"])
    run = bench.run_once("eager", opts, iters=240, startup_s=3.0 if fallback else 0.0, root=str(tmp_path))
    it = run["iter_ms"]
    assert run["meta"]["recorded"], run["meta"]["notes"]
    assert len(it) == 240 and all(t > 0 for t in it)
    if fallback:
        assert any("recorded the step window instead" in n for n in run["meta"]["notes"]), run["meta"]["notes"]
    import statistics

    before = statistics.median(it[20:58])
    after = statistics.median(it[90:])
    print(f"same process: before the window {before:.2f} ms, after {after:.2f} ms, x{after / before:.3f}")
