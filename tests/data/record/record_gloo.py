"""Record a 2-process DDP loop on CPU (gloo) with torch.profiler, one trace per rank.

    torchrun --nproc_per_node 2 tests/data/record/record_gloo.py --out DIR [--straggler-ms 30]

``--straggler-ms``: rank 1 sleeps that long on the host before each forward (a planted
straggler: the other rank waits for it in the gradient all-reduce). The loop's bare step
times (no profiler, same process, before profiling) are written to DIR/bare_steps.json, per
rank, so tests can check a verdict against what the loop does unprofiled.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--straggler-ms", type=float, default=0.0)
p.add_argument("--width", type=int, default=512)
p.add_argument("--steps", type=int, default=6)
a = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
w = a.width
model = DDP(nn.Sequential(nn.Linear(w, 2 * w), nn.GELU(), nn.Linear(2 * w, w)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, w)


def step():
    if rank == 1 and a.straggler_ms:
        time.sleep(a.straggler_ms / 1e3)  # planted host work on rank 1
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


for _ in range(3):
    step()
bare = []
for _ in range(10):
    dist.barrier()
    t0 = time.perf_counter()
    step()
    bare.append((time.perf_counter() - t0) * 1e3)
dist.barrier()
os.makedirs(a.out, exist_ok=True)
sched = torch.profiler.schedule(wait=0, warmup=1, active=a.steps)
path = os.path.join(a.out, f"rank{rank}.pt.trace.json")
with torch.profiler.profile(
    activities=[torch.profiler.ProfilerActivity.CPU],
    schedule=sched,
    record_shapes=True,
    on_trace_ready=lambda prof: prof.export_chrome_trace(path),
) as prof:
    for _ in range(1 + a.steps):
        step()
        prof.step()
got = [None] * world
dist.all_gather_object(got, {"rank": rank, "bare_step_ms": bare})
if rank == 0:
    with open(os.path.join(a.out, "bare_steps.json"), "w") as f:
        json.dump({"straggler_ms": a.straggler_ms, "width": w, "ranks": got}, f, indent=1)
dist.destroy_process_group()
