"""A small GPT trained on random tokens, timing each of its own iterations: an unmodified
training script, the kind people run whole under ``proflab run``.

    python examples/gpt_train.py --iters 150 [--compile] [--fused] [--startup-s 3]
    proflab run -- python examples/gpt_train.py --iters 150

Each iteration (forward, backward, AdamW step, ``loss.item()``) is timed end to end; the last
line printed is JSON: ``{"iter_ms": [...], ...}``. ``--startup-s`` stands for a slow start
(data preparation, a checkpoint load) between ``import torch`` and the first step. Without
CUDA it runs a smaller model on the CPU.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, block: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=150)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--fused", action="store_true", help="fused AdamW (CUDA only)")
    p.add_argument("--startup-s", type=float, default=0.0, help="seconds of slow start before the first step")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    torch.manual_seed(0)
    vocab, d, layers, heads, block, batch = (8192, 512, 6, 8, 256, 16) if cuda else (512, 64, 2, 4, 32, 4)
    end = time.monotonic() + args.startup_s
    model = GPT(vocab, d, layers, heads, block).to(dev)
    while time.monotonic() < end:  # "loading": Python work, not a sleep the profiler would skip over
        sum(i * i for i in range(20000))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=args.fused and cuda)
    step_model = torch.compile(model) if args.compile else model
    x = torch.randint(0, vocab, (batch, block), device=dev)
    y = torch.randint(0, vocab, (batch, block), device=dev)
    times = []
    for i in range(args.iters):
        t0 = time.perf_counter()
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=cuda):
            loss = F.cross_entropy(step_model(x).flatten(0, 1).float(), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_v = loss.item()
        times.append((time.perf_counter() - t0) * 1e3)
        if i % 25 == 0:
            print(f"iter {i} loss {loss_v:.3f} {times[-1]:.2f} ms", flush=True)
    print(json.dumps({"iter_ms": [round(t, 4) for t in times], "device": dev, "compile": args.compile}), flush=True)


if __name__ == "__main__":
    main()
