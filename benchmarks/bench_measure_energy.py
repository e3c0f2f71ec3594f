"""Cost of wrapping every step in ``proflab.measure_energy()``, against the bare loop, before
and after the background counter reader, in one run.

    python benchmarks/bench_measure_energy.py [--steps 4000] [--before-steps 100] [--size 2048] [--json OUT]

Each step is a bf16 matmul of SIZE x SIZE followed by torch.cuda.synchronize() (as a training
step's loss.item() would). Loops, interleaved over ``--repeats`` so drift hits all alike:

- ``bare``: the step alone;
- ``before_*``: wrapped in the previous implementation, kept here as ``DirectReadMeter`` (NVML
  started, the counter read at entry and exit of every block, NVML shut down), with ``min_s=0``
  and the default floor (``--before-steps`` steps: each costs milliseconds);
- ``after_default`` / ``after_min0``: wrapped in ``proflab.measure_energy`` (timestamps only;
  the reader thread reads the counter) with the default floor and with ``min_s=0`` (every
  block gets an energy, resolved after the loop: the time to resolve one is printed apart);
- ``bare_reader_running``: the bare step while the reader runs (an outer block is open), the
  reader's own effect on the measured thread.

Prints the median step time of each (µs), the ratio to bare, the cost per block (wrapped -
bare, µs), one NVML energy read, and what the reader saw (reads per second, counter update
interval, how closely an update's time is known). Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import proflab
from proflab.collect import measure


class DirectReadMeter:
    """The implementation before the reader (kept for this comparison): NVML started at each
    block's entry, the counter read at entry and exit, NVML shut down."""

    def __init__(self, devices, min_s):
        self.devices, self.min_s, self.measurements = devices, min_s, []

    def __call__(self, fn):
        import pynvml

        def wrapper():
            pynvml.nvmlInit()
            hs = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.devices}
            torch.cuda.synchronize()
            e0 = {i: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) for i, h in hs.items()}
            t0 = time.perf_counter()
            try:
                return fn()
            finally:
                torch.cuda.synchronize()
                t = time.perf_counter() - t0
                e1 = {i: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) for i, h in hs.items()}
                self.measurements.append((t, None if t < self.min_s else {i: (e1[i] - e0[i]) / 1000 for i in hs}))
                pynvml.nvmlShutdown()

        wrapper.measurements = self.measurements
        return wrapper


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--before-steps", type=int, default=100)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)

    def body():
        torch.mm(a, a, out=c)
        torch.cuda.synchronize()

    for _ in range(200):
        body()

    def loop(f, n) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        return (time.perf_counter() - t0) / n

    def bare() -> float:
        return loop(body, args.steps)

    def before(min_s: float) -> float:
        f = DirectReadMeter([0], min_s)(body)
        dt = loop(f, args.before_steps)
        assert len(f.measurements) == args.before_steps
        return dt

    resolve_us: list[float] = []

    def after(min_s: float) -> float:
        meter = proflab.measure_energy(devices=[0], min_s=min_s)
        f = meter(body)
        f()  # the reader is up (it may have ended between loops: it lingers 2 s)
        dt = loop(f, args.steps)
        assert len(f.measurements) == args.steps + 1
        if min_s == 0:
            ms = f.measurements[1:]
            ms[-1].energy_j  # waits for the counter's update after the last block
            t0 = time.perf_counter()
            got = sum(m.energy_j is not None for m in ms)
            resolve_us.append((time.perf_counter() - t0) / len(ms) * 1e6)
            assert got == len(ms), [m.reason for m in ms if m.energy_j is None][:3]
        return dt

    def bare_reader_running() -> float:
        with proflab.measure_energy(devices=[0]):
            time.sleep(0.05)
            return bare()

    rows: dict[str, list[float]] = {k: [] for k in ("bare", "before_min0", "before_default", "after_default",
                                                      "after_min0", "bare_reader_running")}
    for _ in range(args.repeats):  # interleaved, so drift hits every loop alike
        rows["bare"].append(bare())
        rows["before_min0"].append(before(0.0))
        rows["before_default"].append(before(measure.MIN_SPAN_S))
        rows["after_default"].append(after(measure.MIN_SPAN_S))
        rows["after_min0"].append(after(0.0))
        rows["bare_reader_running"].append(bare_reader_running())
    med = {k: statistics.median(v) * 1e6 for k, v in rows.items()}

    # what the reader sees: one read, the counter's update interval, how well an update is placed
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    t0 = time.perf_counter()
    for _ in range(200):
        pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    read_us = (time.perf_counter() - t0) / 200 * 1e6
    pynvml.nvmlShutdown()
    meter = proflab.measure_energy(devices=[0])
    with meter:
        t0 = time.perf_counter()
        for _ in range(int(1.5 / (med["bare"] * 1e-6))):
            body()
        r = measure._READER
        tr = r.tracks[0]
        ut = list(tr.ut)
    gaps = [(b - a) * 1e3 for a, b in zip(ut, ut[1:]) if a >= t0 - 0.5]
    res = meter.result
    out = {
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "python": sys.version.split()[0],
        "steps": args.steps, "before_steps": args.before_steps, "size": args.size, "repeats": args.repeats,
        "poll_s": measure.POLL_S, "energy_read_us": round(read_us, 1),
        "counter_update_interval_ms": {"median": round(statistics.median(gaps), 1), "min": round(min(gaps), 1),
                                       "max": round(max(gaps), 1), "n": len(gaps)} if gaps else None,
        "update_time_known_within_ms": round((measure.POLL_S * 1e3 + read_us / 1e3) / 2, 1),
        "resolve_one_block_us": round(statistics.median(resolve_us), 2) if resolve_us else None,
        "check_block": {"time_s": round(res.time_s, 3), "energy_j": res.energy_j, "basis": res.basis,
                        "mean_power_w": None if res.mean_power_w is None else round(res.mean_power_w, 1)},
        "bare_step_us": round(med["bare"], 1),
    }
    for k in rows:
        if k == "bare":
            continue
        out[f"{k}_step_us"] = round(med[k], 1)
        out[f"{k}_ratio"] = round(med[k] / med["bare"], 4)
        out[f"{k}_cost_per_block_us"] = round(med[k] - med["bare"], 2)
    out["per_repeat_us"] = {k: [round(x * 1e6, 2) for x in v] for k, v in rows.items()}
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
