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
import subprocess
import sys
from pathlib import Path

import pytest

import proflab

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "examples" / "gpt_train.py"
PROFLAB = [sys.executable, "-m", "proflab", "run", "--no-analyze"]

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


def _run(tmp_path: Path, prog: list[str], *opts: str, timeout: int = 600) -> Path:
    done = subprocess.run(
        [*PROFLAB, "-o", str(tmp_path / "runs"), *opts, "--", *prog],
        capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    runs = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def _assert_step_windows(run: Path, traces: int = 1) -> dict:
    meta = json.loads((run / "meta.json").read_text())
    assert meta["recorded"] is True, meta["why_no_trace"]
    assert len(meta["traces"]) == traces, meta
    for t in meta["traces"]:
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


def test_after_the_window_the_program_runs_at_its_bare_speed(tmp_path):
    # The case that left eager runs 15-26 % slower: the time-window fallback starts during a
    # slow start-up and is dropped for the step window.
    # Bare runs of the same program differ by up to +-11 % between processes on the H100
    # (benchmarks/README.md: 13.6-18.5 ms for one 120-iteration script in one call), so the
    # profiled run is judged against the slower of bare runs made before and after it, with a
    # 10 % margin: the residue this guards against was 1.26-1.48x. The 2 % target is the
    # benchmark's, over medians of several runs.
    bench = _bench()
    bare = [bench.medians(bench.run_once("eager", None, iters=120, startup_s=3.0)["iter_ms"])]
    prof = bench.run_once("eager", ["--delay", "1"], iters=120, startup_s=3.0, root=str(tmp_path))
    bare.append(bench.medians(bench.run_once("eager", None, iters=120, startup_s=3.0)["iter_ms"]))
    m = bench.medians(prof["iter_ms"])
    assert prof["meta"]["recorded"], prof["meta"]["notes"]
    assert any("recorded the step window instead" in n for n in prof["meta"]["notes"]), prof["meta"]["notes"]
    ratio = m["after_ms"] / max(b["after_ms"] for b in bare)
    print(f"after the window: profiled {m['after_ms']:.2f} ms, bare {[round(b['after_ms'], 2) for b in bare]} ms, x{ratio:.3f}")
    assert ratio < 1.10, (m, bare, prof["meta"]["notes"])


# Measured on 2x H200 (one call each): step window 1.046 and 0.972; after a dropped fallback
# 1.274 in one call, while in the next the steps *before* the window ran slow (37.3 ms against
# 22.9 ms without a fallback) and after it 25.1 ms: the dropped session's CUPTI teardown is
# asynchronous (it runs on a later CUDA call) and races the next session's start, so where its
# cost lands differs from run to run. Open: the fallback case is expected to fail until the
# collection stops starting a session it may drop.
@pytest.mark.parametrize(
    "fallback",
    [False, pytest.param(True, marks=pytest.mark.xfail(reason="residue after a dropped time-window fallback (open)", strict=False))],
    ids=["step-window", "fallback-dropped"],
)
def test_after_the_window_the_same_process_runs_as_before_it(tmp_path, fallback):
    """The same process before and after its window: no process-to-process spread (bare runs
    of one script differ by up to +-20 % between processes here, which hides a 2 % residue;
    within one process the medians still move by up to 5 %). 60 steps run before the step
    window (``--wait 60``) and 160 after it; with the fallback variant, a time-window profiler
    was also started during a slow start-up and dropped before the first of those steps, the
    case that left eager runs 15-26 % slower."""
    bench = _bench()
    opts = ["--wait", "60"] + (["--delay", "1"] if fallback else ["--window", "steps"])
    run = bench.run_once("eager", opts, iters=240, startup_s=3.0 if fallback else 0.0, root=str(tmp_path))
    it = run["iter_ms"]
    assert run["meta"]["recorded"], run["meta"]["notes"]
    import statistics

    before = statistics.median(it[20:58])
    after = statistics.median(it[90:])
    ratio = after / before
    print(f"same process: before the window {before:.2f} ms, after {after:.2f} ms, x{ratio:.3f}")
    assert ratio < 1.06, (before, after, run["meta"]["notes"])
