"""Cost of wrapping every step in ``proflab.measure_energy()``, against the bare loop.

    python benchmarks/bench_measure_energy.py [--steps 400] [--size 2048]

Each step is a bf16 matmul of SIZE x SIZE followed by torch.cuda.synchronize() (as a training
step's loss.item() would). Prints the bare step time, the wrapped step time, their ratio, and
the cost per call (wrapped - bare) in microseconds; with ``min_s=0`` (every call reads the
counter and reports energy) and with the default floor. Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import proflab


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)

    def body():
        torch.mm(a, a, out=c)
        torch.cuda.synchronize()

    for _ in range(50):
        body()

    def bare() -> float:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            body()
        return (time.perf_counter() - t0) / args.steps

    def wrapped(min_s: float) -> float:
        meter = proflab.measure_energy(devices=[0], min_s=min_s)
        f = meter(body)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            f()
        dt = (time.perf_counter() - t0) / args.steps
        assert len(f.measurements) == args.steps
        return dt

    rows = {"bare": [], "wrapped_min0": [], "wrapped_default": []}
    for _ in range(args.repeats):  # interleaved, so drift hits all three alike
        rows["bare"].append(bare())
        rows["wrapped_min0"].append(wrapped(0.0))
        rows["wrapped_default"].append(wrapped(proflab.measure_energy().min_s))
    med = {k: statistics.median(v) * 1e6 for k, v in rows.items()}
    import pynvml

    t0 = time.perf_counter()
    for _ in range(50):
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    init_us = (time.perf_counter() - t0) / 50 * 1e6
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    t0 = time.perf_counter()
    for _ in range(1000):
        pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    read_us = (time.perf_counter() - t0) / 1000 * 1e6
    pynvml.nvmlShutdown()
    out = {"steps": args.steps, "size": args.size, "repeats": args.repeats, "gpu": torch.cuda.get_device_name(0),
           "bare_step_us": round(med["bare"], 1), "nvml_init_shutdown_us": round(init_us, 1),
           "energy_read_us": round(read_us, 2)}
    for k in ("wrapped_min0", "wrapped_default"):
        out[f"{k}_step_us"] = round(med[k], 1)
        out[f"{k}_ratio"] = round(med[k] / med["bare"], 3)
        out[f"{k}_cost_per_call_us"] = round(med[k] - med["bare"], 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
