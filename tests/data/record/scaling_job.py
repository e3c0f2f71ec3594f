"""One scaling-study training loop, timed GPU-side step by step, for ``record_scaling.py``.

The loop is one of ``record_nccl.py``'s scenarios (``balanced``, ``straggler``, ``commbound``,
built by its ``_build``), unchanged, with no profiler of its own: started plain under torchrun
it gives the **bare** step times; started under ``proflab run`` (through ``proflab scaling
--gpus``) the same steps run with proflab's window among them::

    torchrun --standalone --nproc_per_node N scaling_job.py --scenario S --times DIR

Every step is timed between CUDA events on the current stream (the step's end waits for its
collectives, which DDP makes the current stream wait on), and each rank writes
``DIR/rank<r>.json``: every step's GPU-side time in ms and the median of the steps after
``--skip`` (default 10: three steps proflab skips, its warm-up step, its five recorded steps
and one more; the same steps in both kinds of run). ``--global-batch B`` (strong scaling)
gives each of the N ranks B/N samples instead of the scenario's batch per GPU. ``--cpu``
runs on CPU over gloo with small shapes (a dry run; host times).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record_nccl import _build, _Clock, _sync, init_process  # noqa: E402

SCENARIOS = ("balanced", "straggler", "commbound")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", choices=SCENARIOS, required=True)
    ap.add_argument("--times", required=True, help="folder for rank<r>.json")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--skip", type=int, default=10)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--global-batch", type=int, help="strong scaling: this batch over all ranks (each takes its share)")
    a = ap.parse_args()
    cuda, rank, world = init_process(a.cpu)
    step, desc = _build(a.scenario, rank, cuda, small=a.cpu, batch_per_gpu=a.global_batch // world if a.global_batch else None)
    dist.barrier()
    _sync(cuda)
    clock = _Clock(cuda, a.steps)
    t0 = time.perf_counter()
    for k in range(a.steps):
        clock.mark(k)
        step()
    clock.mark(a.steps)
    times = clock.times_ms()
    wall = time.perf_counter() - t0
    kept = times[a.skip:]
    os.makedirs(a.times, exist_ok=True)
    rec = {
        "scenario": a.scenario,
        "description": desc,
        "global_batch": a.global_batch,
        "rank": rank,
        "world_size": world,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "clock": "cuda_event" if cuda else "perf_counter",
        "skip": a.skip,
        "gpu_step_ms": times,
        "median_ms": round(statistics.median(kept), 4),
        "wall_s": round(wall, 3),
    }
    with open(os.path.join(a.times, f"rank{rank}.json"), "w") as fh:
        json.dump(rec, fh, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
