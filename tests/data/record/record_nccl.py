"""Record multi-GPU jobs over NCCL with their ground truth: bare step times per rank and traces.

One process per GPU (torchrun); each run is one scenario at one GPU count::

    torchrun --nproc_per_node 2 tests/data/record/record_nccl.py --scenario straggler --out DIR

and writes ``DIR/<scenario>/<N>gpu/rank<r>.pt.trace.json.gz`` plus ``DIR/<scenario>/<N>gpu/
truth.json``. Scenarios (each a training loop a user would write, not a planted kernel):

``balanced``         DDP, 4-layer MLP (width 4096), bf16 autocast, AdamW, batch 256 per GPU: the
                     gradient all-reduces run under the backward pass. Expected: no job warning.
``straggler``        ``balanced`` with rank 1 sleeping 30 ms on the host before each forward (a
                     planted straggler). Expected: ``load_imbalance`` naming rank 1, cause host.
``commbound``        DDP, six 8192x8192 linear layers (fp32, TF32 off), batch 64 per GPU, SGD:
                     1.6 GB of fp32 gradients per step and little compute to hide them under.
                     Expected: ``communication_bound``; weak scaling well below 100%.
``commbound_fixed``  the same with the fixes ``communication_bound`` proposes: bf16 gradient
                     compression hook, ``bucket_cap_mb=100``, ``gradient_as_bucket_view=True``.
``fsdp``             the ``commbound`` model under FSDP2 (``fully_shard`` per layer): all-gathers
                     in forward and backward, reduce-scatters of the gradients.

Per rank, in this order and in the same process:

``bare``        the loop with no profiler: GPU-side step times (CUDA events at each step boundary
                on the current stream; the step's end waits for its collectives, which DDP and
                FSDP make the current stream wait on), 30 steps after 8 warm-up steps.
``profiled``    torch.profiler (CPU + CUDA, record_shapes; wait 1, warmup 2, active 5): the same
                GPU-side times of the active steps, so the profiler's inflation is measured.
``bare_after``  the bare loop again after the profiler.

A ``dist.barrier()`` and a device synchronize precede each phase so that all ranks start it
together. ``--cpu`` runs the same code on CPU over gloo with small shapes (a dry run of the
script; its timings are host times, not GPU-side).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record_kineto import _finalize  # noqa: E402  (Kineto's own JSON, path prefixes stripped)

SCENARIOS = ("balanced", "straggler", "commbound", "commbound_fixed", "fsdp")
WAIT, WARMUP, ACTIVE = 1, 2, 5
STRAGGLER_MS = 30.0


def _build(scenario: str, rank: int, cuda: bool, small: bool, batch_per_gpu: int | None = None):
    """(step function, description) for one scenario on this rank; ``batch_per_gpu`` replaces
    the scenario's own (a strong-scaling study divides a global batch by the ranks)."""
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    if scenario in ("balanced", "straggler"):
        width, batch = (256, 16) if small else (4096, 256)
        batch = batch_per_gpu or batch
        layers = [m for _ in range(4) for m in (nn.Linear(width, width), nn.GELU())]
        model = DDP(nn.Sequential(*layers).to(dev))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        autocast = cuda
        desc = f"DDP MLP 4x{width}, bf16 autocast, AdamW, batch {batch}/GPU"
    else:
        width, batch = (512, 8) if small else (8192, 64)
        batch = batch_per_gpu or batch
        seq = nn.Sequential(*[nn.Linear(width, width) for _ in range(6)]).to(dev)
        autocast = False
        if scenario == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for layer in seq:
                fully_shard(layer)
            model = fully_shard(seq)
            desc = f"FSDP2 (fully_shard per layer), 6x Linear({width},{width}) fp32, SGD, batch {batch}/GPU"
        elif scenario == "commbound_fixed":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            model = DDP(seq, bucket_cap_mb=100, gradient_as_bucket_view=True)
            # the bf16 hook needs NCCL; the CPU dry run uses the fp16 one
            hook = default_hooks.bf16_compress_hook if cuda else default_hooks.fp16_compress_hook
            model.register_comm_hook(dist.group.WORLD, hook)
            desc = (f"DDP 6x Linear({width},{width}) fp32, SGD, batch {batch}/GPU, bf16_compress_hook, "
                    "bucket_cap_mb=100, gradient_as_bucket_view=True")
        else:
            model = DDP(seq)
            desc = f"DDP 6x Linear({width},{width}) fp32, SGD, batch {batch}/GPU, default buckets (25 MB)"
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=dev)
    y = torch.randn(batch, width, device=dev)
    sleep_s = STRAGGLER_MS / 1e3 if scenario == "straggler" and rank == 1 else 0.0

    def step() -> None:
        if sleep_s:
            time.sleep(sleep_s)  # planted host work on rank 1
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step, desc


class _Clock:
    """GPU-side step boundaries (CUDA events) or, on CPU, host timestamps."""

    def __init__(self, cuda: bool, n: int) -> None:
        self.cuda = cuda
        self.marks = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)] if cuda else [0.0] * (n + 1)

    def mark(self, k: int) -> None:
        if self.cuda:
            self.marks[k].record()
        else:
            self.marks[k] = time.perf_counter()

    def times_ms(self) -> list[float]:
        _sync(self.cuda)
        if self.cuda:
            return [round(a.elapsed_time(b), 4) for a, b in zip(self.marks, self.marks[1:])]
        return [round((b - a) * 1e3, 4) for a, b in zip(self.marks, self.marks[1:])]


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _bare(step, cuda: bool, n: int) -> dict:
    dist.barrier()
    _sync(cuda)
    clock = _Clock(cuda, n)
    t0 = time.perf_counter()
    for k in range(n):
        clock.mark(k)
        step()
    clock.mark(n)
    times = clock.times_ms()
    wall = (time.perf_counter() - t0) * 1e3
    return {"gpu_step_ms": times, "median_ms": round(statistics.median(times), 4), "wall_per_step_ms": round(wall / n, 4)}


def _profiled(step, cuda: bool, raw: str) -> dict:
    from torch.profiler import ProfilerActivity, profile, schedule

    n = WAIT + WARMUP + ACTIVE
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    dist.barrier()
    _sync(cuda)
    clock = _Clock(cuda, n)
    with profile(activities=acts, schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE), record_shapes=True,
                 on_trace_ready=lambda p: p.export_chrome_trace(raw)) as prof:
        for k in range(n):
            clock.mark(k)
            step()
            prof.step()
        clock.mark(n)
    times = clock.times_ms()[WAIT + WARMUP:]
    return {"gpu_step_ms": times, "median_ms": round(statistics.median(times), 4)}


def init_process(cpu: bool) -> tuple[bool, int, int]:
    """This torchrun worker's GPU (TF32 off) and process group: (CUDA in use, rank, world size)."""
    cuda = not cpu
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group("nccl" if cuda else "gloo")
    return cuda, dist.get_rank(), dist.get_world_size()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", choices=SCENARIOS, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bare-steps", type=int, default=30)
    ap.add_argument("--cpu", action="store_true", help="dry run on CPU over gloo, small shapes")
    a = ap.parse_args()
    cuda, rank, world = init_process(a.cpu)
    t_setup = time.perf_counter()
    step, desc = _build(a.scenario, rank, cuda, small=a.cpu)
    for _ in range(8):
        step()
    _sync(cuda)
    setup_s = time.perf_counter() - t_setup
    rec: dict = {"rank": rank, "bare": _bare(step, cuda, a.bare_steps)}
    out = os.path.join(a.out, a.scenario, f"{world}gpu")
    os.makedirs(out, exist_ok=True)
    raw = os.path.join(tempfile.mkdtemp(prefix="nccl_"), f"rank{rank}.json")
    rec["profiled"] = _profiled(step, cuda, raw)
    rec["bare_after"] = _bare(step, cuda, a.bare_steps)
    trace = os.path.join(out, f"rank{rank}.pt.trace.json.gz")
    _finalize(raw, trace, host_name="gpu-host")
    rec["trace"] = os.path.basename(trace)
    rec["bytes"] = os.path.getsize(trace)
    rec["setup_s"] = round(setup_s, 2)
    got: list = [None] * world
    dist.all_gather_object(got, rec)
    if rank == 0:
        truth = {
            "scenario": a.scenario,
            "description": desc,
            "world_size": world,
            "straggler_ms": STRAGGLER_MS if a.scenario == "straggler" else 0.0,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
            "schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE, "record_shapes": True},
            "ranks": got,
        }
        with open(os.path.join(out, "truth.json"), "w") as fh:
            json.dump(truth, fh, indent=1)
        meds = [(r["bare"]["median_ms"], r["profiled"]["median_ms"], r["bare_after"]["median_ms"]) for r in got]
        print(f"{a.scenario} x{world}: bare/profiled/after per rank {meds}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
