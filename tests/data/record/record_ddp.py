"""Record a real two-GPU DistributedDataParallel training loop with torch.profiler, one trace per rank.

The traces (``tests/data/kineto/ddp/ddp_rank{0,1}.pt.trace.json.gz``) give the analysis real NCCL
kernels: the all-reduces that DDP overlaps with the backward pass, and the exposed part that the
communication split of the breakdown must find.

Usage (one process per GPU)::

    torchrun --nproc_per_node=2 tests/data/record/record_ddp.py --out DIR

The model is a 4-layer MLP (width 4096, bf16 autocast) on synthetic data, batch 256 per rank,
AdamW; profiler schedule wait=1, warmup=2, active=3 with record_shapes.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    width = 4096
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.GELU())]).cuda()
    model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(256, width, device="cuda")
    y = torch.randn(256, width, device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()
    torch.cuda.synchronize()
    tmp = os.path.join(args.out, f"tmp_rank{rank}")
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=1, warmup=2, active=3),
        record_shapes=True,
        on_trace_ready=tensorboard_trace_handler(tmp, worker_name=f"rank{rank}", use_gzip=True),
    ) as prof:
        for _ in range(6):
            step()
            prof.step()
    torch.cuda.synchronize()
    (made,) = glob.glob(os.path.join(tmp, "*.pt.trace.json.gz"))
    shutil.move(made, os.path.join(args.out, f"ddp_rank{rank}.pt.trace.json.gz"))
    shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
