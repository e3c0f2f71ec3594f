"""How `proflab analyze` scales with trace size, on realistic-shape traces.

Generates (once; kept in ``--work``) ``gen_realistic.py`` traces of the requested sizes and,
in one run, for each size, in child processes one after another:

* **baseline**: the decode floor, msgspec decoding every event of the file into a struct of
  four fields (cat, ts, dur, tid): what any reader of the JSON must at least do;
* **proflab**: ``python -m proflab analyze TRACE --format json --no-cache`` (every analysis
  and rule; stdout to a file), and, with ``--cache``, after a run that writes the cache: the
  same again (**report**: answered from the report cache) and with ``--top 16`` (**tables**:
  a new analysis over the cached tables).

It prints wall time and peak RSS (``ru_maxrss`` of the child, from ``os.wait4``, and the largest
sum over the child and its helper process, sampled from /proc every 20 ms) per size, the
memory bound (0.4 x the uncompressed size + 300 MB), proflab / baseline, and the growth
factor per doubling of the size (2 ** k where time ~ size ** k between consecutive sizes:
2.0 is linear).

Usage::

    python benchmarks/bench_scaling.py                          # 50 150 500 1500 MB
    python benchmarks/bench_scaling.py --sizes 50 150 --json-out scaling.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

_FLOOR = r"""
import sys, msgspec
class E(msgspec.Struct, gc=False):
    cat: str = ""
    ts: float = 0.0
    dur: float = 0.0
    tid: int | str = 0
class D(msgspec.Struct, gc=False):
    traceEvents: list[E]
with open(sys.argv[1], "rb") as f:
    d = msgspec.json.decode(f.read(), type=D)
print(len(d.traceEvents))
"""


def child(cmd: list[str], out_path: Path | None, mem_gb: float, env: dict[str, str] | None = None) -> dict:
    """Run one child: wall seconds, its own peak RSS and that of it and its descendants together
    (MiB), and its CPU seconds and minor page faults (its waited-for descendants' included)."""

    def limit() -> None:
        if mem_gb:
            b = int(mem_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (b, b))

    out = open(out_path, "wb") if out_path else subprocess.DEVNULL
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, preexec_fn=limit, cwd=ROOT, env=env)
    tree_peak = [0]
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_tree, args=(p.pid, tree_peak, stop), daemon=True)
    sampler.start()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    err = p.stderr.read().decode(errors="replace").strip() if p.stderr else ""
    if out_path:
        out.close()
    rc = os.waitstatus_to_exitcode(status)
    return {"wall_s": round(wall, 3), "peak_mib": round(ru.ru_maxrss / 1024, 1), "tree_peak_mib": round(tree_peak[0] / 2**20, 1),
            "user_s": round(ru.ru_utime, 2), "sys_s": round(ru.ru_stime, 2), "faults": ru.ru_minflt,
            "rc": rc, "stderr": err[-400:] if rc else ""}


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _sample_tree(pid: int, peak: list[int], stop: threading.Event) -> None:
    """Largest sum of RSS over the process and its descendants (the helper), every 20 ms:
    ``ru_maxrss`` gives each process's own peak, not what they hold together."""
    while not stop.is_set():
        todo, total = [pid], 0
        while todo:
            q = todo.pop()
            total += _rss_bytes(q)
            todo += _children(q)
        peak[0] = max(peak[0], total)
        stop.wait(0.02)


def growth(rows: list[dict], key: str) -> list[float | None]:
    """Per consecutive pair of sizes: 2 ** k with value ~ size ** k."""
    out: list[float | None] = [None]
    for a, b in zip(rows, rows[1:]):
        va, vb = a.get(key), b.get(key)
        if not va or not vb or a["bytes"] == b["bytes"]:
            out.append(None)
            continue
        k = math.log(vb / va) / math.log(b["bytes"] / a["bytes"])
        out.append(round(2**k, 2))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=float, nargs="+", default=[50, 150, 500, 1500], metavar="MB")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "proflab-scaling",
                   help="where generated traces are kept between runs")
    p.add_argument("--mem-limit-gb", type=float, default=8.0, help="address-space limit per child (0: none)")
    p.add_argument("--cache", action="store_true", help="also time a second analyze that reads the columnar cache")
    p.add_argument("--skip-baseline", action="store_true")
    p.add_argument("--json-out", type=Path)
    a = p.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    rows = []
    for mb in a.sizes:
        trace = a.work / f"realistic_{mb:g}mb.json"
        if not trace.exists():
            t0 = time.perf_counter()
            gen = subprocess.run([sys.executable, str(HERE / "gen_realistic.py"), str(trace), "--size-mb", str(mb)],
                                 check=True, capture_output=True, text=True)
            print(f"generated {trace.name} in {time.perf_counter() - t0:.1f} s: {gen.stdout.strip()}", file=sys.stderr)
        size = trace.stat().st_size
        row: dict = {"size_mb": mb, "bytes": size, "bound_mib": round((0.4 * size + 300e6) / 2**20, 1)}
        if not a.skip_baseline:
            r = child([sys.executable, "-c", _FLOOR, str(trace)], None, a.mem_limit_gb, env)
            row["baseline"] = r
        report = a.work / f"report_{mb:g}mb.json"
        cache_dir = a.work / "cache"
        cmd = [sys.executable, "-m", "proflab", "analyze", str(trace), "--format", "json"]
        row["proflab"] = child(cmd + ["--no-cache"], report, a.mem_limit_gb, env)
        try:
            rep = json.loads(report.read_text())
            row["events"] = rep["source"]["inputs"][0]["events"]
            row["gaps"] = sum(rep["idle"]["gaps_by_cause"].values())
        except (ValueError, KeyError, TypeError):
            pass
        if a.cache:
            cenv = dict(env, PROFLAB_CACHE_DIR=str(cache_dir))
            child(cmd, None, a.mem_limit_gb, cenv)  # writes the cache: tables and report
            row["cached"] = child(cmd, None, a.mem_limit_gb, cenv)  # the report cache
            # the table cache alone: other options make another report
            row["tables"] = child(cmd + ["--top", "16"], None, a.mem_limit_gb, cenv)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)

    for r in rows:
        r["t"] = r["proflab"]["wall_s"] if r["proflab"]["rc"] == 0 else None
        r["m"] = r["proflab"]["peak_mib"] if r["proflab"]["rc"] == 0 else None
    gt, gm = growth(rows, "t"), growth(rows, "m")
    head = f"{'size MB':>8} {'events':>10} {'gaps':>8} | {'floor s':>7} {'MiB':>6} | {'proflab s':>9} {'peak MiB':>8} {'both':>6} {'bound':>6} {'x floor':>7} | {'t/2x':>5} {'m/2x':>5}"
    if a.cache:
        head += f" | {'report s':>8} {'MiB':>6} | {'tables s':>8} {'MiB':>6}"
    print(head)
    for r, g1, g2 in zip(rows, gt, gm):
        b = r.get("baseline", {})
        pr = r["proflab"]
        ratio = f"{pr['wall_s'] / b['wall_s']:.2f}" if b.get("wall_s") and pr["rc"] == 0 else "-"
        line = (
            f"{r['bytes'] / 1e6:>8.0f} {r.get('events', '-'):>10} {r.get('gaps', '-'):>8} | "
            f"{b.get('wall_s', '-'):>7} {b.get('peak_mib', '-'):>6} | "
            f"{pr['wall_s'] if pr['rc'] == 0 else 'rc=' + str(pr['rc']):>9} {pr['peak_mib']:>8} {pr['tree_peak_mib']:>6} {r['bound_mib']:>6} {ratio:>7} | "
            f"{g1 if g1 is not None else '-':>5} {g2 if g2 is not None else '-':>5}"
        )
        if a.cache and "cached" in r:
            line += f" | {r['cached']['wall_s']:>8} {r['cached']['peak_mib']:>6} | {r['tables']['wall_s']:>8} {r['tables']['peak_mib']:>6}"
        print(line)
        if pr["rc"]:
            print(f"  proflab failed: {pr['stderr']}")
    print("peak MiB: ru_maxrss (the largest single process); both: the largest sum over proflab and its helper, "
          "sampled every 20 ms; t/2x, m/2x: growth of time and peak RSS per doubling of the size (2.0 = linear); "
          "bound = 0.4 x size + 300 MB; floor = msgspec decode of every event (4 fields); "
          "report: again from the report cache; tables: --top 16 over the cached tables")
    if a.json_out:
        a.json_out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
