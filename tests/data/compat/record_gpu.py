"""Record the conformance corpus's GPU traces with whatever PyTorch and GPU this machine has.

    python tests/data/compat/record_gpu.py OUT_DIR [--budget-s 110]

One small workload (a 2-layer MLP forward, bf16, batch 512: two GEMMs and a GELU), profiled
for 3 active steps with a light profiler (CPU + CUDA activity, no shapes, no stacks), in the
forms a trace can take:

- ``compiled_max_autotune``: ``torch.compile(mode="max-autotune")``. Compiled (and its CUDA
  graph warmed up) outside the profiler; the first profiled step records the CUDA graph
  (Triton launches through the driver, ``cuLaunchKernel``), the next ones replay it
  (``cudaGraphLaunch``).
- ``compiled_no_cudagraphs``: ``mode="max-autotune-no-cudagraphs"``: the Triton kernels run
  from ``cuLaunchKernel`` every step.
- ``eager_cudagraph``: the eager forward captured once into a ``torch.cuda.CUDAGraph`` and
  replayed.
- ``eager_chrome``: plain eager, written by ``prof.export_chrome_trace`` (plain JSON), not
  by ``tensorboard_trace_handler``.
- ``nccl_world1``: ``all_reduce`` (and ``all_gather_into_tensor``) over a one-process NCCL
  group (``init_process_group`` with a ``file://`` store). NCCL runs no kernel for a single
  rank (the gather becomes a device-to-device copy), so this trace holds the collectives'
  host calls, not NCCL's kernel names: those need two GPUs.

Each trace is written gzip-compressed as OUT_DIR/<name>.pt.trace.json.gz. OUT_DIR/bare.json
records, per workload, the bare (unprofiled) median step time (``bare_ms``) measured with CUDA
events over 20 steps, and the versions. A workload that fails is recorded there with its error; one that
would start past the time budget is skipped, so the run ends on time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

ACTIVE = 3


def mlp():
    torch.manual_seed(0)
    w1 = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16) / 32
    w2 = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16) / 64
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)

    def fwd(inp):
        return torch.nn.functional.gelu(inp @ w1) @ w2

    return fwd, x


def bare_ms(step, n: int = 20) -> float:
    """Median step time without the profiler, from CUDA events around each step."""
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return round(statistics.median(times), 4)


def profiled(step, out: Path, name: str, *, chrome: bool = False, warmup: int = 1) -> None:
    """3 active steps after ``warmup`` steps, light profiler, gzip."""
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with tempfile.TemporaryDirectory() as tmp:
        if chrome:
            with profile(activities=acts) as prof:
                for _ in range(ACTIVE):
                    step()
                    torch.cuda.synchronize()
                    prof.step()
            plain = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(plain))
            with open(plain, "rb") as src, gzip.open(out / f"{name}.json.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            return
        with profile(
            activities=acts,
            schedule=schedule(wait=0, warmup=warmup, active=ACTIVE, repeat=1),  # one cycle: one trace
            on_trace_ready=tensorboard_trace_handler(tmp, use_gzip=True),
        ) as prof:
            for _ in range(warmup + ACTIVE):
                step()
                torch.cuda.synchronize()
                prof.step()
        (made,) = Path(tmp).glob("*.pt.trace.json.gz")
        shutil.copyfile(made, out / f"{name}.pt.trace.json.gz")


def eager(out: Path) -> dict:
    fwd, x = mlp()
    step = lambda: fwd(x)  # noqa: E731
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    ms = bare_ms(step)
    profiled(step, out, "eager_chrome", chrome=True)
    return {"bare_ms": ms}


def eager_cudagraph(out: Path) -> dict:
    fwd, x = mlp()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fwd(x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fwd(x)  # noqa: F841 (kept alive by the graph's pool)
    step = graph.replay
    ms = bare_ms(step)
    profiled(step, out, "eager_cudagraph")
    return {"bare_ms": ms}


def compiled(out: Path, mode: str, name: str) -> dict:
    fwd, x = mlp()
    f = torch.compile(fwd, mode=mode)
    t0 = time.perf_counter()
    with torch.no_grad():
        f(x)  # compile (and, with CUDA graphs, the warmup run)
        torch.cuda.synchronize()
        compile_s = round(time.perf_counter() - t0, 1)
        # with CUDA graphs the profiled window's first step records the graph (no profiler
        # warmup step, which would take the recording), the next ones replay it
        profiled(lambda: f(x), out, name, warmup=0)
        ms = bare_ms(lambda: f(x))
    return {"bare_ms": ms, "compile_s": compile_s}


def nccl(out: Path) -> dict:
    import torch.distributed as dist

    store = Path(tempfile.mkdtemp()) / "store"
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        t = torch.ones(1 << 20, device="cuda")
        gathered = torch.empty(1 << 20, device="cuda")

        def step():
            dist.all_reduce(t)
            dist.all_gather_into_tensor(gathered, t)

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        ms = bare_ms(step)
        profiled(step, out, "nccl_world1")
        return {"bare_ms": ms, "nccl_version": ".".join(map(str, torch.cuda.nccl.version()))}
    finally:
        dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--budget-s", type=float, default=110.0)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    info = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "python": sys.version.split()[0],
        "workload": "bf16 MLP forward, x[512,1024] @ w1[1024,4096] -> gelu -> @ w2[4096,1024]",
        "runs": {},
    }
    jobs = [
        ("eager_chrome", lambda: eager(a.out), 10),
        ("eager_cudagraph", lambda: eager_cudagraph(a.out), 10),
        ("nccl_world1", lambda: nccl(a.out), 15),
        ("compiled_max_autotune", lambda: compiled(a.out, "max-autotune", "compiled_max_autotune"), 60),
        ("compiled_no_cudagraphs", lambda: compiled(a.out, "max-autotune-no-cudagraphs", "compiled_no_cudagraphs"), 20),
    ]
    for name, job, need_s in jobs:
        elapsed = time.perf_counter() - start
        if elapsed + need_s > a.budget_s:
            info["runs"][name] = {"skipped": f"{elapsed:.0f} s of {a.budget_s:.0f} s used"}
            continue
        t0 = time.perf_counter()
        try:
            info["runs"][name] = {**job(), "wall_s": round(time.perf_counter() - t0, 1)}
        except Exception as e:  # record what failed and go on with the next form
            info["runs"][name] = {"error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()[-1500:]}
        print(name, info["runs"][name], flush=True)
        (a.out / "bare.json").write_text(json.dumps(info, indent=1))
    (a.out / "bare.json").write_text(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "16")
    sys.exit(main())
