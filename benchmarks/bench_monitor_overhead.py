"""Overhead of the GPU monitor on a CUDA training loop: monitor off vs on, in one run.

    python benchmarks/bench_monitor_overhead.py [--period 0.1] [--repeats 10] [--steps 200]

A small transformer-ish MLP trains in bf16 (steps of a few ms, where a sampling thread that
holds the GIL would show); each repeat times ``--steps`` steps with the monitor off and then
on (order alternating between repeats, so drift hits both alike), each step timed end to end
with a synchronize. Prints the median step time of each mode, the overhead in percent
(target: <= 1 %), and what one sampling tick costs the sampling thread.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from proflab.collect.monitor import GPUMonitor, available


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--period", type=float, default=0.1, help="monitor period in s (default 0.1)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--width", type=int, default=4096)
    args = p.parse_args()
    a = available()
    if not torch.cuda.is_available() or not a:
        print(f"needs a CUDA GPU and NVML ({a.reason or 'no CUDA device'})")
        return 2

    torch.manual_seed(0)
    w = args.width
    model = nn.Sequential(*[nn.Sequential(nn.Linear(w, 4 * w), nn.GELU(), nn.Linear(4 * w, w)) for _ in range(4)])
    model = model.cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(512, w, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(512, w, device="cuda", dtype=torch.bfloat16)

    def steps(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            loss = F.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    steps(30)  # warm-up: cuBLAS handles, allocator, clocks
    off: list[float] = []
    on: list[float] = []
    costs = []
    samples = 0
    for r in range(args.repeats):
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
            if mode == "off":
                off.append(statistics.median(steps(args.steps)))
            else:
                with GPUMonitor(args.period) as mon:
                    on.append(statistics.median(steps(args.steps)))
                s = mon.summary()
                costs.append(s.mean_sample_cost_ms)
                samples += s.samples
    m_off, m_on = statistics.median(off), statistics.median(on)
    overhead = (m_on - m_off) / m_off * 100
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; period {args.period} s")
    print(f"step time, monitor off: {m_off:.3f} ms (median of {args.repeats} repeat medians; spread {min(off):.3f}-{max(off):.3f})")
    print(f"step time, monitor on:  {m_on:.3f} ms (spread {min(on):.3f}-{max(on):.3f}); {samples} samples taken")
    print(f"overhead: {overhead:+.2f} % (target <= 1 %)")
    print(f"one sampling tick: {statistics.mean(costs):.3f} ms in the monitor thread")
    return 0 if overhead <= 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
