"""What reading a large trace costs uncached, and what ``analyze``, ``sql``, ``compare`` and
``report`` cost once it is cached: each against its floor and the issue's target.

In one run, every command a child process (``python -m proflab ...`` as a user runs it),
one after another, with a private cache folder; wall time and CPU seconds (user + system of
the child and the helper process it waits for, from ``os.wait4``) and peak RSS:

* **uncached read** ``analyze -f json --no-cache`` against the decode floor (msgspec decoding
  every event into a struct of four fields, as ``bench_scaling.py``); target 2 s wall.
* **analyze** again from the report cache; target 0.3 s.
* **sql** ``select count(*) from gpu``, a group-by over ``cpu`` and one over the analysis
  table ``kernels``: the first query (polars, keeps the tables as DuckDB files in the cache
  entry) and the repeats (DuckDB alone), against
  the floor of starting Python and importing DuckDB; ``-f csv`` (always the polars path) for
  reference; target 0.3 s.
* **compare A B** of two cached traces: the first (analyses both sides from the table cache
  and keeps them) and the repeats (report cache); target 0.3 s per side.
* **report** (HTML page) of a cached trace: the first and the repeats; target 0.3 s.

The machine may be shared: compare CPU seconds where wall times vary. Usage::

    python benchmarks/bench_cache_paths.py --trace A.json --other B.json
    python benchmarks/bench_cache_paths.py --size-mb 500        # generates realistic traces
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from bench_scaling import _FLOOR  # noqa: E402


def child(cmd: list[str], env: dict[str, str], out: Path | None = None) -> dict:
    t0 = time.perf_counter()
    with open(out or os.devnull, "wb") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.PIPE, cwd=ROOT, env=env)
        _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace").strip()
    p.stderr.close()
    rc = os.waitstatus_to_exitcode(status)
    if rc:
        raise SystemExit(f"{' '.join(cmd[2:])}: exit {rc}: {err[-400:]}")
    return {"wall_s": round(wall, 3), "cpu_s": round(ru.ru_utime + ru.ru_stime, 3), "peak_mib": round(ru.ru_maxrss / 1024, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, help="the large trace (default: generated with gen_realistic.py)")
    p.add_argument("--other", type=Path, help="the other side of compare (default: generated, 0.9x the size)")
    p.add_argument("--size-mb", type=float, default=500)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "proflab-scaling")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json-out", type=Path)
    a = p.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)

    def generated(mb: float) -> Path:
        t = a.work / f"realistic_{mb:g}mb.json"
        if not t.exists():
            subprocess.run([sys.executable, str(HERE / "gen_realistic.py"), str(t), "--size-mb", str(mb)], check=True, capture_output=True)
        return t

    trace = a.trace or generated(a.size_mb)
    other = a.other or generated(round(a.size_mb * 0.9))
    cache = Path(tempfile.mkdtemp(prefix="proflab-bench-cache-"))
    src = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = dict(os.environ, PYTHONPATH=src, PROFLAB_CACHE_DIR=str(cache))
    env.pop("PROFLAB_NO_CACHE", None)
    py, pf = sys.executable, [sys.executable, "-m", "proflab"]
    rows: list[tuple[str, str, dict, float | None, dict | None]] = []  # (group, label, result, target, floor)

    def rep(group, label, cmd, target=None, floor=None, n=a.repeats):
        runs = [child(cmd, env) for _ in range(n)]
        best = min(runs, key=lambda r: r["wall_s"])
        best = dict(best, walls=[r["wall_s"] for r in runs], cpus=[r["cpu_s"] for r in runs])
        rows.append((group, label, best, target, floor))
        return best

    size = trace.stat().st_size
    print(f"trace {trace} ({size / 1e6:.0f} MB), other {other} ({other.stat().st_size / 1e6:.0f} MB), cache {cache}", file=sys.stderr)
    floor_decode = rep("read", "decode floor (msgspec, 4 fields)", [py, "-c", _FLOOR, str(trace)], n=1)
    rep("read", "analyze -f json --no-cache", [*pf, "analyze", str(trace), "-f", "json", "--no-cache"], 2.0, floor_decode, n=max(1, a.repeats - 1))
    first = child([*pf, "analyze", str(trace), "-f", "json"], env)
    rows.append(("analyze", "analyze -f json, first (writes the caches)", first, None, None))
    child([*pf, "analyze", str(other), "-f", "json"], env)
    floor_py = rep("floor", "python -c 'import duckdb'", [py, "-c", "import duckdb"], n=a.repeats)
    rep("analyze", "analyze -f json (report cache)", [*pf, "analyze", str(trace), "-f", "json"], 0.3, floor_py)
    for q in ("select count(*) from gpu", "select cat, count(*), sum(dur_ns) from cpu group by cat order by 1",
              "select name, count(*), sum(dur_ns) from kernels group by name order by 3 desc limit 10"):
        rows.append(("sql", f"sql '{q}', first (polars; keeps the table)", child([*pf, "sql", str(trace), q], env), None, None))
        rep("sql", f"sql '{q}'", [*pf, "sql", str(trace), q], 0.3, floor_py)
        rep("sql", f"sql '{q}' -f csv (polars path)", [*pf, "sql", str(trace), q, "-f", "csv"], None, floor_py)
    rows.append(("compare", "compare A B, first (table cache; keeps both sides)", child([*pf, "compare", str(trace), str(other), "-f", "json"], env), None, None))
    rep("compare", "compare A B -f json (report cache)", [*pf, "compare", str(trace), str(other), "-f", "json"], 0.6, floor_py)
    rep("compare", "compare A B (terminal)", [*pf, "compare", str(trace), str(other)], 0.6, floor_py)
    html = cache / "page.html"
    rows.append(("report", "report -o page.html, first (table cache; keeps the page's parts)", child([*pf, "report", str(trace), "-o", str(html)], env), None, None))
    rep("report", "report -o page.html (report cache)", [*pf, "report", str(trace), "-o", str(html)], 0.3, floor_py)

    print("\n| command | wall s (best; all) | CPU s (all) | peak MiB | floor | proflab / floor | target | met |")
    print("|---|---|---|---:|---|---:|---:|---|")
    out = []
    for group, label, r, target, floor in rows:
        walls = r.get("walls", [r["wall_s"]])
        cpus = r.get("cpus", [r["cpu_s"]])
        ratio = f"{r['wall_s'] / floor['wall_s']:.1f}x" if floor else ""
        fl = f"{floor['wall_s']:.2f} s" if floor else ""
        met = "" if target is None else ("yes" if r["wall_s"] <= target else "no")
        print(f"| {label} | {r['wall_s']:.2f}; {', '.join(f'{w:.2f}' for w in walls)} | {', '.join(f'{c:.2f}' for c in cpus)} | "
              f"{r['peak_mib']:.0f} | {fl} | {ratio} | {'' if target is None else f'{target:g} s'} | {met} |")
        out.append({"group": group, "command": label, **r, "floor": floor, "target_s": target})
    if a.json_out:
        a.json_out.write_text(json.dumps({"trace": str(trace), "bytes": size, "rows": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
