"""How often does NVML's total-energy counter (and its power reading) actually change?

Polls ``nvmlDeviceGetTotalEnergyConsumption`` and ``nvmlDeviceGetPowerUsage`` (and the
instantaneous power field) on one GPU in a tight loop, idle and then under a bf16 matmul load
run by a child process, and records the distribution of the intervals between changes of each
reading. proflab's energy attribution floor (``analysis.energy``) is the counter's update
interval measured here.

    python benchmarks/probe_energy_counter.py --seconds 3 -o tests/data/energy/nvml_counter_h100.json

Needs a GPU, pynvml, and torch for the load. Changes no GPU setting.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

_LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); c = torch.empty_like(a)
torch.mm(a, a, out=c); torch.cuda.synchronize(); print("ready", flush=True)
t0 = time.perf_counter()
while time.perf_counter() - t0 < {seconds}:
    for _ in range(20):
        torch.mm(a, a, out=c)
    torch.cuda.synchronize()
"""

_FI_POWER_INSTANT = 186  # NVML_FI_DEV_POWER_INSTANT (mW)


def _stats(t_s: np.ndarray, v: np.ndarray) -> dict:
    """Intervals (ms) between the polls at which ``v`` changed, and what each change added."""
    ch = np.flatnonzero(np.diff(v) != 0) + 1
    iv = np.diff(t_s[ch]) * 1e3
    out = {"changes": int(len(ch)), "polls": int(len(v))}
    if len(iv):
        q = np.percentile(iv, [0, 5, 25, 50, 75, 95, 100])
        out.update({f"interval_{k}_ms": round(float(x), 3) for k, x in zip(("min", "p5", "p25", "median", "p75", "p95", "max"), q)})
        out["interval_mean_ms"] = round(float(iv.mean()), 3)
    return out


def poll(pynvml, h, seconds: float) -> dict:
    ts, es, ps, pis = [], [], [], []
    t_end = time.perf_counter() + seconds
    while True:
        t = time.perf_counter()
        if t >= t_end:
            break
        es.append(pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
        ps.append(pynvml.nvmlDeviceGetPowerUsage(h))
        try:
            fv = pynvml.nvmlDeviceGetFieldValues(h, [_FI_POWER_INSTANT])[0]
            pis.append(fv.value.uiVal if fv.nvmlReturn == 0 else -1)
        except Exception:
            pis.append(-1)
        ts.append(t)
    t = np.array(ts)
    e = np.array(es, dtype=np.int64)
    p = np.array(ps, dtype=np.int64)
    pi = np.array(pis, dtype=np.int64)
    ch = np.flatnonzero(np.diff(e) != 0) + 1
    de = np.diff(e[ch]) if len(ch) > 1 else np.array([])
    return {
        "seconds": round(float(t[-1] - t[0]), 3),
        "poll_period_us": round(float(np.median(np.diff(t))) * 1e6, 1),
        "energy_counter": {**_stats(t, e), "increment_median_mj": float(np.median(de)) if len(de) else None,
                           "mean_power_w": round(float((e[-1] - e[0]) / 1e3 / (t[-1] - t[0])), 1)},
        "power_usage": {**_stats(t, p), "median_w": round(float(np.median(p)) / 1e3, 1)},
        "power_instant": ({**_stats(t, pi), "median_w": round(float(np.median(pi)) / 1e3, 1)}
                          if (pi >= 0).all() else None),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="polling time per phase (s)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("-o", "--out", help="write the JSON here too")
    args = ap.parse_args()
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(args.device)
        name = pynvml.nvmlDeviceGetName(h)
        res = {"gpu": name if isinstance(name, str) else name.decode(), "driver": str(pynvml.nvmlSystemGetDriverVersion()),
               "method": "tight-loop polling of nvmlDeviceGetTotalEnergyConsumption, nvmlDeviceGetPowerUsage and "
                         "field NVML_FI_DEV_POWER_INSTANT; intervals between the polls at which each value changed",
               "idle": poll(pynvml, h, args.seconds)}
        load = subprocess.Popen([sys.executable, "-c", _LOAD.format(seconds=args.seconds + 2.0)], stdout=subprocess.PIPE, text=True)
        try:
            if load.stdout.readline().strip() != "ready":
                raise SystemExit("the load process did not start")
            time.sleep(1.0)  # the power ramp
            res["load"] = poll(pynvml, h, args.seconds)
            res["load"]["workload"] = "bf16 torch.mm 8192x8192 in a child process"
        finally:
            load.wait(timeout=60)
    finally:
        pynvml.nvmlShutdown()
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
