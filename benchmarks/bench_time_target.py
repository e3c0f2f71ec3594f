"""The 514 MB benchmark trace's time, run after run, beside the decode floor: whether
``proflab analyze`` meets its time target (2 s on 2 cores) and how much of the spread between
runs is the machine's.

A single run says little on a shared machine: the same analysis takes 1.7 s in one minute and
2.4 s in another, with the same CPU work done more slowly (its CPU seconds rise with its wall
time). So each repeat runs, one right after the other, in child processes:

* **floor**: msgspec decoding every event of the file into a struct of four fields (cat, ts,
  dur, tid) on one core (``bench_scaling.py``'s baseline): what any reader of the JSON must at
  least do, and a gauge of how fast the machine runs at that moment;
* **proflab**: ``python -m proflab analyze TRACE --format json --no-cache`` (every analysis and
  rule; the report to a file).

It prints each repeat's wall seconds, proflab's CPU seconds, peak RSS and its time over the
floor's, then the medians, and whether the median meets the target; then each phase of the
analysis (``analyze --timings``: decode, tables, timeline, what-if, memory, rules, render and
the rest) as its median seconds, over the floor's and as a share of the run, with its peak, so
that a regression names its phase. The ratio to the floor
holds where the machine slows down as a whole; a ratio that rises says proflab itself did.

The trace is ``gen_kineto.py``'s, 172 steps of ``tests/data/kineto/train_loop.pt.trace.json.gz``
(514 MB, 1.6 M events: the HTA benchmark's), generated once into ``--work``; or ``--trace``.

``--against SRC`` runs another proflab beside it in each repeat (``SRC`` put first on
``PYTHONPATH``: the ``src`` folder of another checkout, such as the commit before a change),
the two in alternating order, and prints its time, peak and ratio beside this one's, and
whether the two wrote the same report (byte for byte). It runs without ``--timings`` (an older
proflab may not have it), so this one carries its sampler's small cost: on a trace analysed
in a fraction of a second, compare within the noise.

Usage::

    python benchmarks/bench_time_target.py                    # 9 repeats
    python benchmarks/bench_time_target.py --trace k514.json --repeats 15 --json-out t.json
    python benchmarks/bench_time_target.py --trace k514.json --repeats 5 --against ../before/src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_scaling import _FLOOR, child  # noqa: E402  (the same floor and child measurement)

SOURCE = HERE.parent / "tests" / "data" / "kineto" / "train_loop.pt.trace.json.gz"
STEPS = 172  # 514 MB
TARGET_S = 2.0


def trace_of(args: argparse.Namespace) -> Path:
    if args.trace:
        return args.trace
    import gen_kineto

    path = args.work / f"kineto_{STEPS}steps.json"
    if not path.exists():
        print(f"generating {path} ...", flush=True)
        gen_kineto.generate(SOURCE, path, None, STEPS)
    return path


def repeat(trace: Path, out: Path, against: Path | None = None, index: int = 0) -> dict:
    floor = child([sys.executable, "-c", _FLOOR, str(trace)], None, 0)
    timings = out.with_name("timings.json")
    cmd = [sys.executable, "-m", "proflab", "analyze", str(trace), "--format", "json", "--no-cache", "-o", str(out),
           "--timings", str(timings)]  # fmt: skip
    other = None
    if against is not None and index % 2:  # (the two in alternating order)
        other = against_run(trace, out, against)
    run = child(cmd, None, 0)
    if against is not None and other is None:
        other = against_run(trace, out, against)
    if run["rc"] != 0 or floor["rc"] != 0:
        raise SystemExit(f"a run failed: proflab {run['rc']} {run['stderr']}; floor {floor['rc']} {floor['stderr']}")
    phases = {r["phase"]: r for r in json.loads(timings.read_text())["phases"]}
    row = {"floor_s": floor["wall_s"], "proflab_s": run["wall_s"], "cpu_s": round(run["user_s"] + run["sys_s"], 2),
           "peak_mib": run["peak_mib"], "ratio": round(run["wall_s"] / floor["wall_s"], 3), "phases": phases}  # fmt: skip
    if other is not None:
        row["against"] = {"wall_s": other["wall_s"], "cpu_s": round(other["user_s"] + other["sys_s"], 2), "peak_mib": other["peak_mib"],
                          "ratio": round(other["wall_s"] / floor["wall_s"], 3), "same_report": out.read_bytes() == other["report"]}  # fmt: skip
    return row


def against_run(trace: Path, out: Path, src: Path) -> dict:
    """The other proflab's run (``--against``): the report it wrote is kept to compare."""
    theirs = out.with_name("against-report.json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(src.resolve()), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "proflab", "analyze", str(trace), "--format", "json", "--no-cache", "-o", str(theirs)]
    run = child(cmd, None, 0, env)
    if run["rc"] != 0:
        raise SystemExit(f"the --against run failed: {run['rc']} {run['stderr']}")
    return {**run, "report": theirs.read_bytes()}


def print_phases(rows: list[dict]) -> dict:
    """Each phase's median over the repeats: seconds, over the floor of the same repeat, share
    of proflab's run, and the largest peak (MiB) any repeat saw in it."""
    names = list(dict.fromkeys(p for r in rows for p in r["phases"]))
    out = {}
    print(f"{'phase':<10} {'median s':>8} {'x floor':>7} {'share':>6} {'peak MiB':>8}")
    for p in names:
        got = [r for r in rows if p in r["phases"]]
        s = statistics.median(r["phases"][p]["wall_s"] for r in got)
        x = statistics.median(r["phases"][p]["wall_s"] / r["floor_s"] for r in got)
        share = statistics.median(r["phases"][p]["wall_s"] / r["proflab_s"] for r in got)
        peaks = [r["phases"][p]["peak_mib"] for r in got if r["phases"][p]["peak_mib"] is not None]
        out[p] = {"median_s": round(s, 3), "x_floor": round(x, 3), "share": round(share, 3), "peak_mib": max(peaks) if peaks else None}
        print(f"{p:<10} {s:>8.3f} {x:>7.3f} {100 * share:>5.1f}% {'-' if not peaks else f'{max(peaks):.0f}':>8}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, help="the trace (default: generated into --work)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "proflab-time-target")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--against", type=Path, metavar="SRC", help="another proflab's source folder, run beside this one (see above)")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    trace = trace_of(args)
    size_mb = trace.stat().st_size / 1e6
    print(f"{trace} ({size_mb:.0f} MB), {args.repeats} repeats; target {TARGET_S:.1f} s", flush=True)
    print(f"{'repeat':>6} {'floor s':>8} {'proflab s':>9} {'CPU s':>6} {'peak MiB':>8} {'x floor':>7}", flush=True)
    rows = []
    for i in range(args.repeats):
        r = repeat(trace, args.work / "report.json", args.against, i)
        rows.append(r)
        a = r.get("against")
        theirs = f"   against {a['wall_s']:.2f} s {a['peak_mib']:.0f} MiB {a['ratio']:.2f}x" if a else ""
        print(f"{i + 1:>6} {r['floor_s']:>8.2f} {r['proflab_s']:>9.2f} {r['cpu_s']:>6.2f} {r['peak_mib']:>8.0f} {r['ratio']:>7.2f}{theirs}", flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in ("floor_s", "proflab_s", "cpu_s", "ratio")}
    times = sorted(r["proflab_s"] for r in rows)
    met = med["proflab_s"] <= TARGET_S
    print(f"median: floor {med['floor_s']:.2f} s, proflab {med['proflab_s']:.2f} s ({times[0]:.2f}-{times[-1]:.2f}), "
          f"CPU {med['cpu_s']:.2f} s, {med['ratio']:.2f}x the floor; peak {max(r['peak_mib'] for r in rows):.0f} MiB")  # fmt: skip
    print(f"time<={TARGET_S:.0f}s at the median: {'yes' if met else 'NO'}")
    if args.against:
        a = [r["against"] for r in rows]
        print(f"against {args.against}: {statistics.median(x['wall_s'] for x in a):.2f} s, CPU {statistics.median(x['cpu_s'] for x in a):.2f} s, "
              f"{statistics.median(x['ratio'] for x in a):.2f}x the floor; peak {max(x['peak_mib'] for x in a):.0f} MiB; "
              f"the same report every repeat: {'yes' if all(x['same_report'] for x in a) else 'NO'}")  # fmt: skip
    phases = print_phases(rows)
    if args.json_out:
        args.json_out.write_text(json.dumps({"trace": str(trace), "size_mb": round(size_mb, 1), "repeats": rows, "median": med,
                                             "phases": phases, "target_s": TARGET_S, "met": met}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
