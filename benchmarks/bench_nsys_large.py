"""A large Nsight Systems export: `proflab analyze` next to the SQL a user would run by hand.

Scales a real export (``gen_nsys.py``) to ``--size-mb``, then runs, each as a child process
(wall time around it, peak RSS from ``os.wait4``):

- **baseline**: the seeds' "SQLite export & custom queries" route, in the sqlite3 module: a
  kernel summary (time per kernel name, joined to StringIds) and a runtime-API summary, the
  two tables ``nsys stats`` starts from. SQLite aggregates while it scans, so this is the
  floor for time and memory; it diagnoses nothing.
- **proflab**: ``python -m proflab analyze BIG.sqlite --format json``, every rule, as a user
  runs it.

It prints both, the time ratio, proflab's peak RSS per event and per byte of export.
Target (issue "Nsight Systems input"): memory follows the events kept, not the file, with no
second copy of the tables; the numbers are in the issue's closing note.

    python benchmarks/bench_nsys_large.py --size-mb 1000
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


def run_child(argv: list[str], out: Path) -> tuple[float, float, int]:
    """(wall s, peak RSS MiB, exit status) of one child process."""
    t0 = time.perf_counter()
    with open(out, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.stderr.write(proc.stderr.read().decode(errors="replace") if proc.stderr else "")
    return wall, usage.ru_maxrss / 1024, proc.returncode


def events(path: Path) -> int:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    wanted = ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
              "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER", "NVTX_EVENTS", "OSRT_API"]  # fmt: skip
    n = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in wanted if t in tables)
    con.close()
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the real export to scale up")
    p.add_argument("--size-mb", type=float, default=1000)
    p.add_argument("--export", type=Path, help="use this large export instead of generating one")
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from gen_nsys import scale

    with tempfile.TemporaryDirectory(prefix="proflab-bench-") as tmp:
        big = args.export
        if big is None:
            if not args.source.exists():
                print(f"no source export at {args.source}; pass --source or --export", file=sys.stderr)
                return 2
            big = Path(tmp) / "big.sqlite"
            print(f"scaling {args.source.name} to {args.size_mb:.0f} MB ...", file=sys.stderr)
            scale(args.source, big, args.size_mb)
        n, size = events(big), big.stat().st_size
        base = run_child([sys.executable, "-c", BASELINE, str(big)], Path(tmp) / "baseline.txt")
        prof = run_child([sys.executable, "-m", "proflab", "analyze", str(big), "--format", "json"], Path(tmp) / "report.json")
        if prof[2] not in (0, 1):  # 1: findings above the threshold, still a full report
            print(f"proflab failed with exit status {prof[2]}", file=sys.stderr)
            return 1
        print(f"export: {size / 1e6:.0f} MB, {n:,} events")
        print(f"{'':34s} {'wall s':>8s} {'peak RSS MiB':>13s}")
        print(f"{'baseline (SQLite summaries)':34s} {base[0]:8.2f} {base[1]:13.0f}")
        print(f"{'proflab analyze (every rule)':34s} {prof[0]:8.2f} {prof[1]:13.0f}")
        print(f"proflab / baseline wall time: {prof[0] / base[0]:.2f}x")
        print(f"proflab peak RSS: {prof[1] * 2**20 / n:.0f} bytes per event, {prof[1] * 2**20 / size:.2f} bytes per export byte")
    return 0


if __name__ == "__main__":
    sys.exit(main())
