"""What ``proflab run`` costs a whole training job: bare vs under ``proflab run``, in one call.

    python benchmarks/bench_run_overhead.py [--iters 150] [--only eager|compiled] [--variants fallback,steps]
        [--compiled-variants fallback,fallback-nomon] [--bare-repeats 2]

Runs examples/gpt_train.py (a small GPT that times its own iterations, synchronised by
``loss.item()``) bare and under ``proflab run`` with the default window (wait 3, warm-up 1,
active 5 steps: iterations 4-8 are recorded, the window closes in iteration 8). Variants:

- ``fallback``: a 3 s slow start and ``--delay 1``, so the time-window fallback starts a
  profiler during start-up and is dropped for the step window (the case that left eager runs
  26 % slower after the window);
- ``steps``: no slow start, no fallback;
- ``fallback-nomon``: as ``fallback`` with ``--no-monitor``;
- extra ``--variant NAME:ENV=VAL,...`` runs, to try Kineto/CUPTI settings.

Prints per variant: the median iteration time after the window (iterations 20..end) bare and
profiled and their ratio (target <= 1.02), the in-window median (iterations 4-8) and ratio,
the window-end iteration (8) in ms, and the run's notes. Bare runs have the same slow start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "gpt_train.py"
IN_WINDOW = range(4, 9)  # iterations 4..8: warm-up step 4 ends the wait, 5 active steps
AFTER_FROM = 20


def run_once(mode: str, proflab: list[str] | None, *, iters: int, startup_s: float, env_extra: dict | None = None,
             root: str | None = None, timeout_s: int = 400) -> dict:
    """One run of the GPT script: bare (``proflab=None``) or under ``proflab run`` with
    those options. Returns {"iter_ms": [...], "meta": {...} or None}."""
    prog = [sys.executable, str(SCRIPT), "--iters", str(iters), "--startup-s", str(startup_s)]
    if mode == "compiled":
        prog.append("--compile")
    env = {**os.environ, **(env_extra or {}), "PYTHONUNBUFFERED": "1"}
    root = root or tempfile.mkdtemp(prefix="bench_run_")
    cmd = prog if proflab is None else [sys.executable, "-m", "proflab", "run", "-o", root, "--no-analyze", *proflab, "--", *prog]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    lines = [l for l in done.stdout.splitlines() if l.startswith('{"iter_ms"')]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    out = json.loads(lines[-1])
    out["meta"] = None
    if proflab is not None:
        runs = sorted(p for p in Path(root).iterdir() if p.is_dir())
        out["meta"] = json.loads((runs[-1] / "meta.json").read_text())
    return out


def medians(iter_ms: list[float]) -> dict:
    return {
        "after_ms": statistics.median(iter_ms[AFTER_FROM:]),
        "window_ms": statistics.median(iter_ms[IN_WINDOW.start:IN_WINDOW.stop]),
        "window_end_ms": iter_ms[IN_WINDOW.stop - 1],
    }


VARIANTS = {
    "fallback": (["--delay", "1"], 3.0, {}),
    "steps": ([], 0.0, {}),
    "fallback-nomon": (["--delay", "1", "--no-monitor"], 3.0, {}),
}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=150)
    p.add_argument("--only", choices=("eager", "compiled"))
    p.add_argument("--variant", action="append", default=[], metavar="NAME:K=V,...",
                   help="an extra fallback run with these environment variables")
    p.add_argument("--variants", default="fallback,steps,fallback-nomon",
                   help="the eager variants to run; default all")
    p.add_argument("--compiled-variants", default="fallback,fallback-nomon",
                   help="the compiled variants to run; default fallback with and without the monitor")
    p.add_argument("--bare-repeats", type=int, default=2,
                   help="bare runs per start-up, spread before and after the profiled runs; the "
                        "ratio is against their median and their spread is the noise to judge it by")
    args = p.parse_args()
    variants = dict(VARIANTS)
    for v in args.variant:
        name, _, kv = v.partition(":")
        variants[name] = (["--delay", "1"], 3.0, dict(x.split("=", 1) for x in kv.split(",") if x))
    modes = [args.only] if args.only else ["eager", "compiled"]
    print(f"bench_run_overhead: {args.iters} iterations; after-window = iterations {AFTER_FROM}..{args.iters - 1}, "
          f"in-window = iterations {IN_WINDOW.start}..{IN_WINDOW.stop - 1}; times in ms")
    for mode in modes:
        extra = [n for n in variants if n not in VARIANTS]
        names = (args.compiled_variants if mode == "compiled" else args.variants).split(",") + extra
        startups = sorted({variants[n][1] for n in names})
        bare_runs: dict[float, list[dict]] = {s: [] for s in startups}

        def bare_run(startup: float) -> None:
            m = medians(run_once(mode, None, iters=args.iters, startup_s=startup)["iter_ms"])
            bare_runs[startup].append(m)
            print(f"{mode:8s} bare (start-up {startup:.0f} s): after {m['after_ms']:.2f}  in-window {m['window_ms']:.2f}  "
                  f"iteration 8 {m['window_end_ms']:.2f}", flush=True)

        first = (args.bare_repeats + 1) // 2
        for startup in startups:
            for _ in range(first):
                bare_run(startup)
        profiled = []
        for name in names:
            opts, startup, env = variants[name]
            r = run_once(mode, opts, iters=args.iters, startup_s=startup, env_extra=env)
            profiled.append((name, startup, medians(r["iter_ms"]), r["meta"]))
        for startup in startups:
            for _ in range(args.bare_repeats - first):
                bare_run(startup)
        for name, startup, m, meta in profiled:
            b = {k: statistics.median(x[k] for x in bare_runs[startup]) for k in ("after_ms", "window_ms", "window_end_ms")}
            spread = [x["after_ms"] / b["after_ms"] for x in bare_runs[startup]]
            print(f"{mode:8s} {name:22s} after {m['after_ms']:.2f} (x{m['after_ms'] / b['after_ms']:.3f}; "
                  f"bare runs x{min(spread):.3f}-x{max(spread):.3f})  "
                  f"in-window {m['window_ms']:.2f} (x{m['window_ms'] / b['window_ms']:.3f})  "
                  f"iteration 8 {m['window_end_ms']:.1f}  traces {len(meta.get('traces') or [])}", flush=True)
            for n in meta.get("notes") or []:
                print(f"         note: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
