"""A large Nsight Systems export: `proflab analyze` next to the SQL a user would run by hand.

Scales a real export (``gen_nsys.py``) to each ``--size-mb``, then runs, each as a child
process (wall time around it; CPU seconds, user + system, and peak RSS from ``os.wait4``: the
machine may be shared, so CPU seconds are printed beside wall time):

- **baseline**: the seeds' "SQLite export & custom queries" route, in the sqlite3 module: a
  kernel summary (time per kernel name, joined to StringIds) and a runtime-API summary, the
  two tables ``nsys stats`` starts from. SQLite aggregates while it scans, so this is the
  floor for time and memory; it diagnoses nothing.
- **SQLite, every row**: for reference, one aggregate per event table that the analysis reads
  (kernels, copies, sets, runtime and driver calls, NVTX ranges with their text, OS runtime
  calls) over the values the reader takes from each row: what only stepping through every
  event costs SQLite, before anything is returned. The summaries touch the kernel and runtime
  tables only; an export of emit_nvtx ranges holds most of its events elsewhere;
- **proflab, whole**: ``python -m proflab analyze BIG.sqlite --format json --no-cache
  --memory-budget none``, every rule over every event, as a user runs it the first time (no
  columnar or report cache to read from or write);
- **proflab, default**: the same within the default memory budget (1.5 GB): an export whose
  whole analysis would need more is analysed in a part from its middle (``readers.budget``);
  the share of its events analysed is read from the report's notes;
- **proflab, every event** (``--all-parts``): the same with ``--all-parts``: every event
  within the default budget, in consecutive parts combined into one report
  (``report.combine``); printed below the table, with its parts.

It prints them per size, the whole analysis's wall and CPU time ratios to the baseline and
peak RSS per event, and whether the targets hold: peak RSS <= 1.5 GB (the default run), and
time within 3x the baseline's (the whole run).

    python benchmarks/bench_nsys_large.py --size-mb 1000 2000
    python benchmarks/bench_nsys_large.py --export A.sqlite --repeats 3   # medians, and the ratio run by run
    python benchmarks/bench_nsys_large.py --export A.sqlite --all-parts   # and every event within the budget
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_SOURCE = HERE.parent.parent / "shared" / "fixtures" / "nsys" / "h100_2gpu_1s.sqlite"

BASELINE = r"""
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
kern = con.execute(
    "SELECT s.value, count(*), sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
    "JOIN StringIds s ON s.id = k.demangledName GROUP BY k.demangledName ORDER BY 3 DESC"
).fetchall()
api = con.execute(
    "SELECT s.value, count(*), sum(r.end - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
    "JOIN StringIds s ON s.id = r.nameId GROUP BY r.nameId ORDER BY 3 DESC"
).fetchall()
print(len(kern), "kernel names;", len(api), "runtime APIs")
"""

# every row's values the reader takes, summed (as floats: no overflow) so SQLite decodes them and returns one row a table
SCAN = r"""
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
columns = {
    "CUPTI_ACTIVITY_KIND_KERNEL": "start, end, demangledName, deviceId, streamId, correlationId, globalPid, gridX, blockX",
    "CUPTI_ACTIVITY_KIND_MEMCPY": "start, end, deviceId, streamId, correlationId, globalPid, bytes, copyKind",
    "CUPTI_ACTIVITY_KIND_MEMSET": "start, end, deviceId, streamId, correlationId, globalPid, bytes",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "start, end, nameId, globalTid, correlationId",
    "CUPTI_ACTIVITY_KIND_DRIVER": "start, end, nameId, globalTid, correlationId",
    "NVTX_EVENTS": "start, end, length(text), textId, globalTid",
    "OSRT_API": "start, end, nameId, globalTid",
}
rows = 0
for t, cols in columns.items():
    if t in tables:
        rows += con.execute(f"SELECT count(*), {', '.join(f'total({c})' for c in cols.split(', '))} FROM {t}").fetchone()[0]
print(rows, "rows")
"""

RSS_TARGET = 1.5e9  # bytes
TIME_TARGET = 3.0  # x the baseline


def run_child(argv: list[str], out: Path | str, env: dict[str, str] | None = None) -> tuple[float, float, int, float]:
    """(wall s, peak RSS MiB, exit status, CPU s) of one child process, its stdout to ``out``."""
    t0 = time.perf_counter()
    with open(out, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.PIPE, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.stderr.write(proc.stderr.read().decode(errors="replace") if proc.stderr else "")
    return wall, usage.ru_maxrss / 1024, proc.returncode, usage.ru_utime + usage.ru_stime


def events(path: Path) -> int:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    wanted = ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
              "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER", "NVTX_EVENTS", "OSRT_API"]  # fmt: skip
    n = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in wanted if t in tables)
    con.close()
    return n


def _median(runs: list[tuple]) -> tuple[float, float, int, float]:
    """(wall s, peak RSS MiB, exit status, CPU s) of several runs of one command: the median
    wall and CPU time, the largest peak and exit status."""
    import statistics

    return (statistics.median(r[0] for r in runs), max(r[1] for r in runs), max(r[2] for r in runs),
            statistics.median(r[3] for r in runs))  # fmt: skip


def _analysed_share(report: Path) -> str:
    """The share of the export's events a report analysed: all, or what its budget note says."""
    import json
    import re

    for note in json.loads(report.read_text()).get("notes", []):
        m = re.search(r"\(\d+%\)", note) if note.startswith("memory budget: reading") else None
        if m:
            return m.group(0)[1:-1]
    return "all"


def _parts(report: Path) -> str:
    """How many parts a report of every event was combined from ("whole": none)."""
    import json

    n = json.loads(report.read_text())["source"]["inputs"][0].get("parts")
    return "whole" if n is None else f"{n} parts"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the real export to scale up")
    p.add_argument("--size-mb", type=float, nargs="+", default=[1000, 2000], help="export sizes to generate (MB)")
    p.add_argument("--export", type=Path, nargs="+", help="use these large exports instead of generating them")
    p.add_argument("--repeats", type=int, default=1, help="runs of each command, interleaved; medians are printed")
    p.add_argument("--all-parts", action="store_true", help="also analyse every event within the default budget (--all-parts)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from gen_nsys import scale

    rows, every = [], []
    with tempfile.TemporaryDirectory(prefix="proflab-bench-") as tmp:
        for i, target in enumerate(args.export or args.size_mb):
            if args.export:
                big = target
            else:
                if not args.source.exists():
                    print(f"no source export at {args.source}; pass --source or --export", file=sys.stderr)
                    return 2
                big = Path(tmp) / "big.sqlite"
                print(f"scaling {args.source.name} to {target:.0f} MB ...", file=sys.stderr)
                scale(args.source, big, target)
            n, size = events(big), big.stat().st_size
            analyze = [sys.executable, "-m", "proflab", "analyze", str(big), "--format", "json", "--no-cache"]
            runs: list[list[tuple]] = [[], [], [], [], []]  # baseline, scan, whole, default budget, every event
            for _ in range(args.repeats):  # (interleaved: a busy spell of the machine hits every command)
                runs[0].append(run_child([sys.executable, "-c", BASELINE, str(big)], Path(tmp) / "baseline.txt"))
                runs[1].append(run_child([sys.executable, "-c", SCAN, str(big)], Path(tmp) / "scan.txt"))
                runs[2].append(run_child([*analyze, "--memory-budget", "none"], Path(tmp) / "report.json"))
                runs[3].append(run_child(analyze, Path(tmp) / "within.json"))
                if args.all_parts:
                    runs[4].append(run_child([*analyze, "--all-parts"], Path(tmp) / "parts.json"))
                if any(r and r[-1][2] not in (0, 1) for r in runs):  # 1: findings above the threshold, still a full report
                    print(f"a run failed with exit status {max(r[-1][2] for r in runs if r)}", file=sys.stderr)
                    return 1
            base, scan, prof, within = map(_median, runs[:4])
            spread = sorted(p[0] / b[0] for p, b in zip(runs[2], runs[0]))
            rows.append((size, n, base, prof, within, _analysed_share(Path(tmp) / "within.json"), scan, spread))
            if args.all_parts:
                every.append((size, base, _median(runs[4]), _parts(Path(tmp) / "parts.json")))
            print(f"export {i + 1}: {size / 1e6:.0f} MB, {n:,} events", file=sys.stderr)
            if not args.export:
                big.unlink()
    print(f"{'export':>9s} {'events':>11s} | {'SQLite summaries':^26s} | {'proflab analyze, whole (every rule)':^35s} | {'ratio':^11s} | "
          f"{'proflab analyze, default budget':^34s} | targets")
    print(f"{'MB':>9s} {'':>11s} | {'wall s':>7s} {'CPU s':>7s} {'RSS MiB':>8s} | {'wall s':>7s} {'CPU s':>7s} {'RSS MiB':>8s} {'B/event':>10s} | "
          f"{'wall':>5s} {'CPU':>5s} | {'wall s':>7s} {'CPU s':>7s} {'RSS MiB':>8s} {'events':>8s} | RSS<=1.5GB time<=3x")  # fmt: skip
    for size, n, base, prof, within, share, _, _ in rows:
        rss_ok = within[1] * 2**20 <= RSS_TARGET
        time_ok = prof[0] / base[0] <= TIME_TARGET
        print(
            f"{size / 1e6:9.0f} {n:11,d} | {base[0]:7.2f} {base[3]:7.2f} {base[1]:8.0f} | {prof[0]:7.2f} {prof[3]:7.2f} {prof[1]:8.0f} "
            f"{prof[1] * 2**20 / n:10.0f} | {prof[0] / base[0]:4.1f}x {prof[3] / base[3]:4.1f}x | "
            f"{within[0]:7.2f} {within[3]:7.2f} {within[1]:8.0f} {share:>8s} | {'yes' if rss_ok else 'NO':>10s} {'yes' if time_ok else 'NO':>7s}"
        )
    if args.repeats > 1:
        print(f"\nmedians of {args.repeats} runs (peak RSS: the largest); the whole analysis against the summaries, run by run:")
        for size, *_, spread in rows:
            print(f"{size / 1e6:9.0f} MB: {spread[0]:.1f}x to {spread[-1]:.1f}x")
    if every:
        print("\nevery event within the default budget (--all-parts), against the SQLite summaries:")
        for size, base, parts, n_parts in every:
            print(f"{size / 1e6:9.0f} MB: {parts[0]:.2f} s wall, {parts[3]:.2f} CPU s, {parts[1]:.0f} MiB, {n_parts}; "
                  f"{parts[0] / base[0]:.1f}x the summaries; RSS<=1.5GB {'yes' if parts[1] * 2**20 <= RSS_TARGET else 'NO'}")
    print("\nfor reference, SQLite stepping through every event row the analysis reads (one aggregate a table):")
    for size, n, base, prof, _, _, scan, _ in rows:
        print(f"{size / 1e6:9.0f} MB: {scan[0]:.2f} s wall, {scan[3]:.2f} CPU s; proflab's whole analysis {prof[0] / scan[0]:.1f}x that, "
              f"the summaries {base[0] / scan[0]:.2f}x")  # fmt: skip
    if len(rows) >= 2:
        (_, n0, _, p0, _, _, _, _), (_, n1, _, p1, _, _, _, _) = rows[0], rows[-1]
        print(f"peak RSS grows {(p1[1] - p0[1]) * 2**20 / (n1 - n0):.0f} bytes per added event "
              f"({p0[1]:.0f} -> {p1[1]:.0f} MiB for {n0:,} -> {n1:,} events)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
