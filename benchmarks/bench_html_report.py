"""The HTML report's size and cost against the trace's size.

For each size, generates a realistic-shape trace (gen_realistic.py), then times
``proflab analyze`` (terminal) and ``proflab report`` (HTML) on it, each in a fresh process and
without the columnar cache, and prints the page's size against the 3 MB budget:

    python benchmarks/bench_html_report.py --sizes 100 500
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUDGET = 3 * 2**20


def _timed(argv: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100], metavar="MB", help="trace sizes in MB (default 100)")
    ap.add_argument("--keep", metavar="DIR", help="keep the traces and pages here")
    args = ap.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="proflab-bench-html-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{'trace MB':>9} {'analyze s':>10} {'report s':>9} {'ratio':>6} {'page MB':>8} {'budget':>7}")
    for mb in args.sizes:
        trace = folder / f"realistic_{mb}mb.pt.trace.json"
        subprocess.run([sys.executable, str(HERE / "gen_realistic.py"), str(trace), "--size-mb", str(mb)],
                       check=True, stdout=subprocess.DEVNULL)
        page = folder / f"realistic_{mb}mb.html"
        cli = [sys.executable, "-m", "proflab"]
        t_analyze = _timed([*cli, "analyze", str(trace), "--no-cache"])
        t_report = _timed([*cli, "report", str(trace), "--no-cache", "-o", str(page)])
        size = page.stat().st_size
        print(f"{trace.stat().st_size / 1e6:>9.0f} {t_analyze:>10.2f} {t_report:>9.2f} {t_report / t_analyze:>5.2f}x "
              f"{size / 2**20:>8.2f} {'ok' if size <= BUDGET else 'OVER':>7}")
        if not args.keep:
            trace.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
