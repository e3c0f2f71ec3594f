"""What ``analyze --perfetto`` costs on top of ``analyze``: time and peak RSS of each, on a
realistic-shape trace (``gen_realistic.py``), in separate processes, best of ``--repeat``.

    python benchmarks/bench_perfetto.py --size-mb 100
    python benchmarks/bench_perfetto.py --trace BIG.json --out marked.json.gz

Prints one row per command and the ratio of the export to the analysis alone.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _run(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and the child's peak RSS (MiB) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, help="an existing trace (default: generate one)")
    p.add_argument("--size-mb", type=float, default=100, help="size of the generated trace (default 100)")
    p.add_argument("--out", default=None, help="the marked trace (default: a temporary .json.gz)")
    p.add_argument("--repeat", type=int, default=2)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = a.trace
        if trace is None:
            trace = Path(tmp) / "big.json"
            subprocess.run([sys.executable, str(HERE / "gen_realistic.py"), str(trace), "--size-mb", str(a.size_mb)], check=True,
                           stdout=subprocess.DEVNULL)
        out = a.out or str(Path(tmp) / "marked.json.gz")
        base = [sys.executable, "-m", "proflab", "analyze", str(trace), "--no-cache", "-f", "json", "-o", os.devnull]
        rows = []
        for label, argv in (("analyze", base), ("analyze --perfetto", base + ["--perfetto", out])):
            # RUSAGE_CHILDREN's peak is the largest child so far: run the smaller command first
            best = min((_run(argv) for _ in range(a.repeat)), key=lambda r: r[0])
            rows.append((label, *best))
        size = trace.stat().st_size / 1e6
        print(f"trace {trace.name}: {size:.0f} MB; marked trace {Path(out).stat().st_size / 1e6:.1f} MB")
        for label, wall, rss in rows:
            print(f"{label:<22} {wall:7.2f} s  peak RSS {rss:7.0f} MiB")
        print(f"export / analysis: {rows[1][1] / rows[0][1]:.2f}x time, {rows[1][2] / rows[0][2]:.2f}x peak RSS")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
