"""A small transformer training loop: the program the kernel deep dive is tested on.

``--trace DIR`` records a torch.profiler (Kineto) trace of steps 3-5 into DIR, which names
the hot kernels; without it the loop runs plain, as it does under ncu.

    python tests/data/record/train_step.py --steps 6 --trace out/
    python tests/data/record/train_step.py --steps 6
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--trace", metavar="DIR")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
    model = nn.Sequential(nn.Embedding(8192, 512), nn.TransformerEncoder(layer, num_layers=2), nn.Linear(512, 8192)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 8192, (16, 256), device="cuda")
    y = torch.randint(0, 8192, (16, 256), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            loss = nn.functional.cross_entropy(out.view(-1, 8192), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if args.trace:
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     schedule=schedule(wait=1, warmup=1, active=3),
                     on_trace_ready=tensorboard_trace_handler(args.trace, use_gzip=True)) as prof:
            for _ in range(args.steps):
                step()
                prof.step()
    else:
        for _ in range(args.steps):
            step()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
