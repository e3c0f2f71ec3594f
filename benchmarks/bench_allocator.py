"""What returning freed memory at once costs and saves: `proflab analyze --no-cache` under
polars' allocator settings, side by side in one run, on a Kineto trace and an Nsight
Systems export.

The CLI starts polars with ``_RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0`` (freed
pages go back to the system at once) to hold the memory bounds, and with
``dirty_decay_ms:100`` where every input is an Nsight Systems export whose estimated whole
analysis leaves the memory budget room for the pages kept (``cli._process.allocator_setting``:
the default 1000 MB export here has none); a user's own setting wins.
Each setting here is such a user setting. Per input and setting, each run a child process
(``python -m proflab analyze INPUT --format json --no-cache``), the best of ``--repeats``:
wall time, user and system CPU seconds and minor page faults (of the process and the reader's
helper, from ``os.wait4``), peak RSS of the process (``ru_maxrss``) and of the process and its
helper together (sampled every 20 ms), the bound (0.4 x the trace + 300 MB for Kineto, 1.5 GB
for an export), and wall time and peak against the shipped setting (the first).

Usage::

    python benchmarks/bench_allocator.py                          # generated: 500 MB, 1000 MB
    python benchmarks/bench_allocator.py --kineto T.json U.json --nsys E.sqlite --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_nsys_large import DEFAULT_SOURCE, RSS_TARGET  # noqa: E402
from bench_scaling import child  # noqa: E402

SHIPPED = "dirty_decay_ms:0,muzzy_decay_ms:0"
SETTINGS = [SHIPPED, "dirty_decay_ms:100,muzzy_decay_ms:0", "dirty_decay_ms:1000,muzzy_decay_ms:1000"]


def run(path: Path, conf: str) -> dict:
    """One `analyze` of ``path`` with the allocator setting ``conf``."""
    cmd = [sys.executable, "-m", "proflab", "analyze", str(path), "--format", "json", "--no-cache"]
    r = child(cmd, None, 0, env={**os.environ, "_RJEM_MALLOC_CONF": conf})
    if r.pop("rc"):
        raise SystemExit(f"{path} with {conf}: {r['stderr']}")
    del r["stderr"]
    return r


def best(path: Path, conf: str, repeats: int) -> dict:
    """The fastest of ``repeats`` runs, with the range of wall times and peaks seen."""
    runs = [run(path, conf) for _ in range(repeats)]
    out = min(runs, key=lambda r: r["wall_s"])
    out["wall_all"] = [r["wall_s"] for r in runs]
    out["peak_all"] = [r["peak_mib"] for r in runs]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kineto", type=Path, nargs="+", help="Kineto traces (default: one generated with gen_realistic.py)")
    p.add_argument("--nsys", type=Path, help="an Nsight Systems export (default: the fixture scaled with gen_nsys.py)")
    p.add_argument("--kineto-mb", type=float, default=500)
    p.add_argument("--nsys-mb", type=float, default=1000)
    p.add_argument("--skip-nsys", action="store_true")
    p.add_argument("--settings", nargs="+", default=SETTINGS, help=f"_RJEM_MALLOC_CONF values (the first is the reference; default: {SETTINGS})")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "proflab-scaling",
                   help="where generated inputs are kept between runs")  # fmt: skip
    p.add_argument("--json-out", type=Path)
    a = p.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    inputs = []
    for kineto in a.kineto or [a.work / f"realistic_{a.kineto_mb:g}mb.json"]:
        if not kineto.exists():
            subprocess.run([sys.executable, str(HERE / "gen_realistic.py"), str(kineto), "--size-mb", str(a.kineto_mb)], check=True)
        inputs.append((kineto, (0.4 * kineto.stat().st_size + 300e6) / 2**20))
    if not a.skip_nsys:
        nsys = a.nsys or a.work / f"nsys_{a.nsys_mb:g}mb.sqlite"
        if not nsys.exists():
            from gen_nsys import scale

            scale(DEFAULT_SOURCE, nsys, a.nsys_mb)
        inputs.append((nsys, RSS_TARGET / 2**20))

    rows = []
    for path, bound in inputs:
        ref = None
        for conf in a.settings:
            r = best(path, conf, a.repeats)
            ref = ref or r
            rows.append({"input": path.name, "mb": round(path.stat().st_size / 1e6), "setting": conf, "bound_mib": round(bound, 1),
                         "wall_x": round(r["wall_s"] / ref["wall_s"], 2), "peak_x": round(r["peak_mib"] / ref["peak_mib"], 2), **r})  # fmt: skip
            print(json.dumps(rows[-1]), file=sys.stderr)

    print(f"\n{'input':<28} {'setting':<40} {'wall s':>7} {'user':>6} {'sys':>6} {'faults':>9} {'peak':>7} {'both':>7} "
          f"{'bound':>7} {'wall x':>6} {'peak x':>6}")  # fmt: skip
    for r in rows:
        over = "" if max(r["peak_mib"], r["tree_peak_mib"]) <= r["bound_mib"] else " over"
        print(f"{r['input'][:28]:<28} {r['setting']:<40} {r['wall_s']:>7.2f} {r['user_s']:>6.2f} {r['sys_s']:>6.2f} {r['faults']:>9,} "
              f"{r['peak_mib']:>7.0f} {r['tree_peak_mib']:>7.0f} {r['bound_mib']:>7.0f} {r['wall_x']:>6.2f} {r['peak_x']:>6.2f}{over}")  # fmt: skip
    print("best of the repeats by wall time; sys: system CPU seconds; faults: minor page faults; peak: the process's RSS (MiB); "
          "both: with the reader's helper process, summed; x: against the first setting (as shipped)")  # fmt: skip
    if a.json_out:
        a.json_out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
