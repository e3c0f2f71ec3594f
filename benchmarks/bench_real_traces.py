"""Every real trace in the repository, analysed beside its decode floor: the ratio per trace.

The target (issue 54): ``proflab analyze`` of every recorded trace the repository holds within
2.0x the decode floor of the same file, measured side by side on the same machine. For each
Kineto trace under ``tests/data`` (and the demo trace the package ships), decompressed once
into ``--work`` (the floor reads plain JSON; proflab reads the same plain file), in child
processes one right after the other:

* **floor**: msgspec decoding every event into a struct of four fields (``bench_scaling.py``'s
  baseline), start-up included: what any reader of the JSON must at least do;
* **proflab**: ``python -m proflab analyze TRACE --format json --no-cache`` (every analysis and
  rule; the report to a file).

Each pair runs ``--repeats`` times (interleaved with the other traces, so a slow minute of a
shared machine falls on every trace alike); the medians are printed per trace, with the ratio
and whether it is within the target, then the traces that miss it and proflab's fixed cost
(its time on the smallest trace, less that trace's floor).

Before timing, the package's bytecode is compiled (as an installed package has it): where the
environment forbids writing bytecode (``PYTHONDONTWRITEBYTECODE``), every run would otherwise
compile proflab's sources again, ~0.12 s that no user pays.

Usage::

    python benchmarks/bench_real_traces.py                         # every trace, 3 repeats
    python benchmarks/bench_real_traces.py --under tests/data/realistic --repeats 5 --json-out r.json
"""

from __future__ import annotations

import argparse
import compileall
import gzip
import json
import lzma
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from bench_scaling import _FLOOR, child  # noqa: E402  (the same floor and child measurement)

TARGET_X = 2.0


def real_traces(under: list[Path]) -> list[Path]:
    """The Kineto traces (``*.pt.trace.json``, plain, ``.gz`` or ``.xz``) under these folders."""
    found = []
    for d in under:
        found += [p for p in d.rglob("*.json*") if p.name.endswith((".trace.json", ".trace.json.gz", ".trace.json.xz"))]
    return sorted(set(found))


def plain(trace: Path, work: Path) -> Path:
    """The trace as plain JSON in ``work`` (decompressed once; kept for the next run)."""
    rel = trace.resolve().relative_to(ROOT) if trace.resolve().is_relative_to(ROOT) else Path(trace.name)
    out = work / "plain" / str(rel).removesuffix(".gz").removesuffix(".xz").replace("/", "__")
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        opener = gzip.open if trace.name.endswith(".gz") else lzma.open if trace.name.endswith(".xz") else open
        with opener(trace, "rb") as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return out


def bytecode() -> None:
    """proflab's modules compiled ahead, as an install has them (see the module doc)."""
    import importlib.util

    spec = importlib.util.find_spec("proflab")
    if spec and spec.submodule_search_locations:
        for d in spec.submodule_search_locations:
            compileall.compile_dir(d, quiet=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--under", type=Path, nargs="+", default=[ROOT / "tests" / "data", ROOT / "src" / "proflab" / "demo"],
                    help="folders searched for traces (default: tests/data and the demo)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "proflab-real-traces")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    bytecode()
    traces = real_traces(args.under)
    files = {t: plain(t, args.work) for t in traces}
    print(f"{len(traces)} traces, {args.repeats} repeats; target <= {TARGET_X:.1f}x the floor", flush=True)
    runs: dict[Path, list[dict]] = {t: [] for t in traces}
    out = args.work / "report.json"
    for _ in range(args.repeats):
        for t, f in files.items():
            floor = child([sys.executable, "-c", _FLOOR, str(f)], None, 0)
            run = child([sys.executable, "-m", "proflab", "analyze", str(f), "--format", "json", "--no-cache", "-o", str(out)], None, 0)
            runs[t].append({"floor_s": floor["wall_s"], "proflab_s": run["wall_s"], "peak_mib": run["peak_mib"],
                            "rc": run["rc"] or floor["rc"], "stderr": run["stderr"] or floor["stderr"]})  # fmt: skip
    rows = []
    print(f"{'trace':<72} {'MB':>6} {'floor s':>7} {'proflab s':>9} {'x floor':>7} {'peak MiB':>8} {'met':>4}")
    for t, f in files.items():
        ok = [r for r in runs[t] if r["rc"] == 0]
        name = str(t.resolve().relative_to(ROOT)) if t.resolve().is_relative_to(ROOT) else str(t)
        if not ok:
            print(f"{name:<72} failed: {runs[t][0]['stderr']}")
            rows.append({"trace": name, "failed": runs[t][0]["stderr"]})
            continue
        fl = statistics.median(r["floor_s"] for r in ok)
        pf = statistics.median(r["proflab_s"] for r in ok)
        x = statistics.median(r["proflab_s"] / r["floor_s"] for r in ok)
        row = {"trace": name, "mb": round(f.stat().st_size / 1e6, 2), "floor_s": fl, "proflab_s": pf, "ratio": round(x, 2),
               "peak_mib": max(r["peak_mib"] for r in ok), "met": x <= TARGET_X}  # fmt: skip
        rows.append(row)
        print(f"{name[-72:]:<72} {row['mb']:>6.1f} {fl:>7.3f} {pf:>9.3f} {x:>7.2f} {row['peak_mib']:>8.0f} {'yes' if row['met'] else 'NO':>4}")
    done = [r for r in rows if "ratio" in r]
    if done:
        small = min(done, key=lambda r: r["mb"])
        big = max(done, key=lambda r: r["mb"])
        missed = [r for r in done if not r["met"]]
        print(f"ratio: median {statistics.median(r['ratio'] for r in done):.2f}x, "
              f"{min(r['ratio'] for r in done):.2f}-{max(r['ratio'] for r in done):.2f}x; "
              f"within {TARGET_X:.1f}x: {len(done) - len(missed)} of {len(done)}")  # fmt: skip
        print(f"fixed cost (smallest trace, {small['mb']:.2f} MB): proflab {small['proflab_s']:.3f} s - floor {small['floor_s']:.3f} s "
              f"= {small['proflab_s'] - small['floor_s']:.3f} s; largest ({big['trace']}, {big['mb']:.1f} MB): {big['ratio']:.2f}x")  # fmt: skip
    if args.json_out:
        args.json_out.write_text(json.dumps({"target_x": TARGET_X, "repeats": args.repeats, "traces": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
