"""What ``proflab run`` costs a whole training job: bare vs under ``proflab run``, in one call,
with runs interleaved so that drift between processes hits both alike.

    python benchmarks/bench_run_overhead.py [--iters 120] [--eager-pairs 5] [--nomon 2]
        [--compiled-pairs 2] [--budget-s 400] [--json OUT.json] [--probe-if-residual] [--cpus 0-7]

Runs examples/gpt_train.py (a small GPT that times its own iterations, synchronised by
``loss.item()``) bare and under ``proflab run`` with the default window (wait 3, warm-up 1,
active 5 steps: iterations 4-8 are recorded, the window closes in iteration 8). Every run has
a 3 s slow start, and profiled runs ``--delay 1``, so the time-window fallback starts a
profiler during start-up and is dropped for the step window (the case that left eager runs
26 % slower after the window). The schedule, one process per run:

- eager: ``--eager-pairs`` bare and profiled runs alternating B P, P B, B P, ... plus
  ``--nomon`` profiled runs with ``--no-monitor`` spread among them (they share the bare runs);
- compiled (``--compile``): ``--compiled-pairs`` pairs, alternating the same way.

A run that would not finish within ``--budget-s`` (judged by the longest run of its kind so
far) is skipped and said so. Per variant it prints the median over runs of each run's median
iteration time after the window (iterations 20..end), bare and profiled, their ratio with a
95 % bootstrap interval (runs resampled), the bare runs' spread, the profiled runs' ratios to
the mean of the bare runs next to them in the schedule, the in-window ratio (iterations 4-8),
and the window-end stall (iteration 8 over its bare median, and the stall the run's notes
state). ``--probe-if-residual``: when a profiled variant's ratio exceeds 1.02, runs
``probe_profiler_residue.py`` scenarios with ``TEARDOWN_CUPTI=1`` (as ``proflab run`` sets) in
the time left. ``--cpus`` pins every run (bare and profiled alike) to those CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "gpt_train.py"
IN_WINDOW = range(4, 9)  # iterations 4..8: warm-up step 4 ends the wait, 5 active steps
AFTER_FROM = 20


def run_once(mode: str, proflab: list[str] | None, *, iters: int, startup_s: float, env_extra: dict | None = None,
             root: str | None = None, timeout_s: int = 400, cpus: set[int] | None = None) -> dict:
    """One run of the GPT script: bare (``proflab=None``) or under ``proflab run`` with
    those options, on ``cpus`` when given (the affinity every process of the run inherits).
    Returns {"iter_ms": [...], "meta": {...} or None}."""
    prog = [sys.executable, str(SCRIPT), "--iters", str(iters), "--startup-s", str(startup_s)]
    if mode == "compiled":
        prog.append("--compile")
    env = {**os.environ, **(env_extra or {}), "PYTHONUNBUFFERED": "1"}
    root = root or tempfile.mkdtemp(prefix="bench_run_")
    cmd = prog if proflab is None else [sys.executable, "-m", "proflab", "run", "-o", root, "--no-analyze", *proflab, "--", *prog]
    t0 = time.perf_counter()
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s, preexec_fn=pin)
    wall = time.perf_counter() - t0
    lines = [l for l in done.stdout.splitlines() if l.startswith('{"iter_ms"')]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    out = json.loads(lines[-1])
    out["meta"] = None
    out["wall_s"] = wall
    if proflab is not None:
        runs = sorted(p for p in Path(root).iterdir() if p.is_dir())
        out["meta"] = json.loads((runs[-1] / "meta.json").read_text())
    return out


def medians(iter_ms: list[float]) -> dict:
    after = sorted(iter_ms[AFTER_FROM:])
    return {
        "after_ms": statistics.median(after),
        "after_p10_p90_ms": [after[len(after) // 10], after[len(after) * 9 // 10]],
        "window_ms": statistics.median(iter_ms[IN_WINDOW.start:IN_WINDOW.stop]),
        "window_end_ms": iter_ms[IN_WINDOW.stop - 1],
    }


STARTUP_S = 3.0
PROFILED = ["--delay", "1"]


def held_ms(meta: dict | None) -> float | None:
    """The window-end stall the run's notes state (ms), if any."""
    for n in (meta or {}).get("notes") or []:
        m = re.search(r"the window's end held the program (\d+) ms", n)
        if m:
            return float(m.group(1))
    return None


def bootstrap_ratio(bare: list[float], prof: list[float], n: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95 % interval of median(prof) / median(bare), runs resampled with replacement."""
    rnd = random.Random(seed)
    rs = sorted(statistics.median(rnd.choices(prof, k=len(prof))) / statistics.median(rnd.choices(bare, k=len(bare)))
                for _ in range(n))
    return rs[int(0.025 * n)], rs[int(0.975 * n) - 1]


def schedule(pairs: int, nomon: int) -> list[str]:
    """B P, P B, B P, ...; the no-monitor runs after the 2nd, 4th, ... profiled run."""
    seq: list[str] = []
    for k in range(pairs):
        seq += ["bare", "profiled"] if k % 2 == 0 else ["profiled", "bare"]
    out, done_p, left = [], 0, nomon
    for x in seq:
        out.append(x)
        if x == "profiled":
            done_p += 1
            if left and done_p % 2 == 0:
                out.append("nomon")
                left -= 1
    out += ["nomon"] * left
    return out


def _list(runs: list[dict]) -> str:
    return ", ".join(f"{r['after_ms']:.2f}" for r in runs)


def summarize(mode: str, runs: list[dict]) -> dict:
    bare = [r for r in runs if r["kind"] == "bare"]
    out: dict = {"mode": mode, "bare_after_ms": [round(r["after_ms"], 3) for r in bare]}
    if not bare:
        return out
    b_after = statistics.median(r["after_ms"] for r in bare)
    b_win = statistics.median(r["window_ms"] for r in bare)
    b_end = statistics.median(r["window_end_ms"] for r in bare)
    out.update(bare_median_after_ms=round(b_after, 3), bare_spread=[round(min(r["after_ms"] for r in bare) / b_after, 3),
                                                                   round(max(r["after_ms"] for r in bare) / b_after, 3)])
    print(f"{mode:8s} bare        after {b_after:.2f} ms (median of {len(bare)} runs: "
          f"{_list(bare)}; "
          f"spread x{out['bare_spread'][0]:.3f}-x{out['bare_spread'][1]:.3f})  iteration 8 {b_end:.1f} ms", flush=True)
    for kind in ("profiled", "nomon"):
        prof = [r for r in runs if r["kind"] == kind]
        if not prof:
            continue
        p_after = statistics.median(r["after_ms"] for r in prof)
        ratio = p_after / b_after
        lo, hi = bootstrap_ratio([r["after_ms"] for r in bare], [r["after_ms"] for r in prof])
        paired = []
        for r in prof:  # against the bare runs next to it in the schedule
            i = runs.index(r)
            near = [x for x in (runs[i - 1] if i else None, runs[i + 1] if i + 1 < len(runs) else None)
                    if x is not None and x["kind"] == "bare"]
            near = near or [min(bare, key=lambda x: abs(runs.index(x) - i))]
            paired.append(r["after_ms"] / statistics.mean(x["after_ms"] for x in near))
        stall = [r["window_end_ms"] - b_end for r in prof]
        held = [h for h in (held_ms(r.get("meta")) for r in prof) if h is not None]
        w_ratio = statistics.median(r["window_ms"] for r in prof) / b_win
        verdict = ("at most 2 % slower than bare" if hi <= 1.02 else
                   "slower than bare by more than 2 %" if lo > 1.02 else
                   "not resolved to 2 % by these runs (the interval is wider)")
        print(f"{mode:8s} {kind:11s} after {p_after:.2f} ms (median of {len(prof)} runs: "
              f"{_list(prof)})  "
              f"ratio x{ratio:.3f}, 95 % interval x{lo:.3f}-x{hi:.3f}: {verdict}; "
              f"paired with neighbouring bare runs: median x{statistics.median(paired):.3f} "
              f"(x{min(paired):.3f}-x{max(paired):.3f})", flush=True)
        print(f"{mode:8s} {kind:11s} in-window x{w_ratio:.3f}; window's end: iteration 8 took "
              f"{statistics.median(stall):+.0f} ms over bare (runs {min(stall):+.0f} to {max(stall):+.0f}); "
              f"the runs' notes: held {', '.join(f'{h:.0f}' for h in held) or 'not stated'} ms", flush=True)
        out[kind] = {"after_ms": [round(r["after_ms"], 3) for r in prof], "median_after_ms": round(p_after, 3),
                     "ratio": round(ratio, 4), "ci95": [round(lo, 4), round(hi, 4)], "verdict": verdict,
                     "paired": [round(x, 4) for x in paired], "in_window_ratio": round(w_ratio, 3),
                     "window_end_over_bare_ms": [round(x, 1) for x in stall], "notes_held_ms": held,
                     "notes": (prof[-1].get("meta") or {}).get("notes")}
    return out


PROBES = ["bare", "one_exported", "dropped_then_exported", "before_ctx_then_exported"]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=120)
    p.add_argument("--eager-pairs", type=int, default=5)
    p.add_argument("--nomon", type=int, default=2, help="eager profiled runs with --no-monitor")
    p.add_argument("--compiled-pairs", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=1e9, help="start no run that would end after this")
    p.add_argument("--json", help="write every run's medians and the summaries here")
    p.add_argument("--probe-if-residual", action="store_true")
    p.add_argument("--cpus", help="run every process on these CPUs (e.g. 0-7,16): the same for bare and profiled")
    args = p.parse_args()
    cpus = None
    if args.cpus:
        cpus = set()
        for part in args.cpus.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    t_start = time.perf_counter()
    print(f"bench_run_overhead: {args.iters} iterations; after-window = iterations {AFTER_FROM}..{args.iters - 1}, "
          f"in-window = iterations {IN_WINDOW.start}..{IN_WINDOW.stop - 1}; {STARTUP_S:.0f} s slow start; "
          f"profiled: proflab run {' '.join(PROFILED)}; CPUs {args.cpus or 'any'}; times in ms", flush=True)
    plan = [("eager", k) for k in schedule(args.eager_pairs, args.nomon)]
    plan += [("compiled", k) for k in schedule(args.compiled_pairs, 0)]
    longest: dict[str, float] = {}
    guess = {"eager": 20.0, "compiled": 60.0}
    runs: dict[str, list[dict]] = {"eager": [], "compiled": []}
    skipped: list[str] = []
    for mode, kind in plan:
        est = longest.get(mode, guess[mode]) * 1.1
        if time.perf_counter() - t_start + est > args.budget_s:
            skipped.append(f"{mode} {kind}")
            continue
        opts = None if kind == "bare" else PROFILED + (["--no-monitor"] if kind == "nomon" else [])
        r = run_once(mode, opts, iters=args.iters, startup_s=STARTUP_S, cpus=cpus)
        longest[mode] = max(longest.get(mode, 0.0), r["wall_s"])
        m = medians(r["iter_ms"])
        runs[mode].append({"kind": kind, **m, "wall_s": round(r["wall_s"], 1), "meta": r["meta"]})
        if args.json:  # kept as it goes: a run cut short still leaves its runs
            Path(args.json + ".partial").write_text(json.dumps(
                {m_: [{k: v for k, v in x.items() if k != "meta"} | {"notes": (x["meta"] or {}).get("notes")} for x in rs]
                 for m_, rs in runs.items()}))
        print(f"  run {sum(map(len, runs.values())):2d} {mode:8s} {kind:8s} after {m['after_ms']:.2f}  in-window "
              f"{m['window_ms']:.2f}  iteration 8 {m['window_end_ms']:.1f}  held {held_ms(r['meta'])}  "
              f"({r['wall_s']:.1f} s)", flush=True)
    if skipped:
        print(f"skipped for the time budget ({args.budget_s:.0f} s): {', '.join(skipped)}", flush=True)
    summaries = [summarize(mode, rs) for mode, rs in runs.items() if rs]
    probes = []
    residual = any(s.get(k, {}).get("ratio", 0) > 1.02 for s in summaries for k in ("profiled", "nomon"))
    if args.probe_if_residual and residual:
        script = Path(__file__).with_name("probe_profiler_residue.py")
        for name in PROBES:
            if time.perf_counter() - t_start + 20 > args.budget_s:
                print(f"probe {name}: skipped for the time budget", flush=True)
                continue
            done = subprocess.run([sys.executable, str(script), name], capture_output=True, text=True, timeout=120,
                                  env={**os.environ, "TEARDOWN_CUPTI": "1"})
            line = [x for x in done.stdout.splitlines() if x.startswith("{")]
            print(f"probe (TEARDOWN_CUPTI=1): {line[-1] if line else done.stderr[-500:]}", flush=True)
            if line:
                probes.append(json.loads(line[-1]))
    if args.json:
        for rs in runs.values():
            for r in rs:
                r["notes"] = (r.pop("meta") or {}).get("notes")
        Path(args.json).write_text(json.dumps({"iters": args.iters, "startup_s": STARTUP_S, "profiled": PROFILED,
                                               "cpus": args.cpus,
                                               "runs": runs, "summaries": summaries, "skipped": skipped,
                                               "probes": probes}, indent=1))
    print(f"done in {time.perf_counter() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
