"""What each torch.profiler collection setting costs in step time, on realistic loops (GPU).

For each loop of ``tests/data/record/record_realistic.py`` this runs, in one process, the bare
loop and the loop under each setting, and prints the profiled GPU-side step time over the
bare one. GPU-side step times come from CUDA events at the step boundaries; the last active
step of each window is left out (it holds the trace's processing, ``on_trace_ready``), so
the ratio is the cost while recording, not the export's.

Settings: ``cuda`` (CUDA activity alone: kernels, copies, runtime calls), ``light`` (+ CPU
ops), ``shapes`` (+ record_shapes), ``stacks`` (+ with_stack), ``heavy`` (both).

    python benchmarks/bench_profiler_cost.py [--loops lm_bf16 mlp_foreach ...] [--active 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import os

# each setting's window in turn, in one process: without teardown Kineto leaves CUPTI attached
# after the first and every later measurement pays for it (the 1.27x "bare after" of mlp_foreach)
os.environ.setdefault("TEARDOWN_CUPTI", "1")
import torch  # noqa: E402
from torch.profiler import ProfilerActivity  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data" / "record"))
import record_realistic as rr  # noqa: E402  (the loops and the bare timing)

SETTINGS = {
    "cuda": dict(activities=[ProfilerActivity.CUDA]),
    "light": dict(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]),
    "shapes": dict(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True),
    "stacks": dict(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True),
    "heavy": dict(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, with_stack=True),
}


def profiled_steps(step, first: int, setting: str, active: int) -> list[float]:
    """GPU-side times (ms) of the active steps but the last, under one setting."""
    times = rr.timed_window(step, first, 1, 1, active, lambda p: None, **SETTINGS[setting])
    return times[2:-1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loops", nargs="*", default=["lm_bf16", "lm_compiled", "mlp_foreach", "cnn_loader", "lm_sync_drain"])
    ap.add_argument("--active", type=int, default=10)
    ap.add_argument("--bare-steps", type=int, default=20)
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args(argv)
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "loops": {}}
    print(f"{'loop':<14} {'bare ms':>8} " + " ".join(f"{s:>7}" for s in SETTINGS) + f" {'after':>7}")
    for name in args.loops:
        torch.manual_seed(0)
        step = rr.LOOPS[name]()
        i = 0
        for _ in range(5):
            step(i)
            i += 1
        bare = statistics.median(rr._gpu_steps(step, i, args.bare_steps))
        i += args.bare_steps
        row = {"bare_ms": round(bare, 3), "ratio": {}}
        for s in SETTINGS:
            t = statistics.median(profiled_steps(step, i, s, args.active))
            i += args.active + 2
            row["ratio"][s] = round(t / bare, 3)
        after = statistics.median(rr._gpu_steps(step, i, args.bare_steps))
        row["after_ratio"] = round(after / bare, 3)
        out["loops"][name] = row
        print(f"{name:<14} {bare:>8.2f} " + " ".join(f"{row['ratio'][s]:>6.2f}x" for s in SETTINGS)
              + f" {row['after_ratio']:>6.2f}x", flush=True)
        del step
        torch.cuda.empty_cache()
        time.sleep(0.5)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
