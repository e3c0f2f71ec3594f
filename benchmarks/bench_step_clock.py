"""What ``proflab run``'s GPU-side step clock costs a step: a loop of short steps with and
without ``GpuStepClock.mark`` at each step's end, in one process, interleaved.

    python benchmarks/bench_step_clock.py [--steps 5000] [--repeats 7] [--size 256] [--poll-every 1 32]

Each step launches one small matmul (``--size``², fp32) and, in the marked loops, records
the step's CUDA event and reads the intervals that completed (what ``proflab run`` does at
each optimizer step outside and inside its window). A step is short on purpose: the host's
cost per step, not the GPU's, is what a mark adds to. Prints the host time per step of
both loops (median of the interleaved repeats), their difference (the mark's cost, us) and
ratio, and checks that the marks read every interval. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def loop(torch, a, b, steps: int, clock) -> float:
    """Host seconds per step over ``steps`` steps, waiting for the GPU at the end."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(steps):
        torch.mm(a, b)
        if clock is not None:
            clock.mark(True, k)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--poll-every", type=int, nargs="+", default=[1, 32], help="marks between reads (proflab run: 32)")
    a = ap.parse_args()
    import torch

    from proflab.collect._child import GpuStepClock

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    x = torch.randn(a.size, a.size, device="cuda")
    y = torch.randn(a.size, a.size, device="cuda")
    loop(torch, x, y, 500, None)
    bare: list[float] = []
    marked: dict[int, list[float]] = {n: [] for n in a.poll_every}
    read: dict[int, list[int]] = {n: [] for n in a.poll_every}
    for _ in range(a.repeats):
        bare.append(loop(torch, x, y, a.steps, None))
        for n in a.poll_every:
            clock = GpuStepClock(torch.cuda, poll_every=n)
            marked[n].append(loop(torch, x, y, a.steps, clock))
            clock.drain()
            read[n].append(len(clock.times))
            assert clock.failed is None, clock.failed
    b = statistics.median(bare)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {a.steps} steps x {a.repeats} repeats, {a.size}^2 fp32 matmul a step")
    print(f"bare {b * 1e6:8.2f} us a step (repeats {', '.join(f'{v * 1e6:.1f}' for v in bare)})")
    for n in a.poll_every:
        m = statistics.median(marked[n])
        print(f"marked, read every {n:>3} marks: {m * 1e6:8.2f} us a step (repeats {', '.join(f'{v * 1e6:.1f}' for v in marked[n])}); "
              f"a mark costs {(m - b) * 1e6:.2f} us: x{m / b:.3f}; intervals read {min(read[n])}-{max(read[n])} of {a.steps - 1}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
