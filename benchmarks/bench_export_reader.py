"""An Nsight Systems export read by the compiled column reader next to the ADBC driver it stands in for.

Scales a real export (``gen_nsys.py``; or takes ``--export``), then:

- **per table**, single-threaded, each query the reader runs over a whole event table (taken
  from a real read of the export): SQLite stepping through its rows (one aggregate a column,
  in the sqlite3 module: what only decoding the rows costs SQLite), the ADBC driver into a
  polars frame, and the compiled reader (``readers._sqlite_native``) into one, with the
  ratios of the two readers to each other and to SQLite;
- **the whole read** (``proflab.load(path, cache=False)``, every table in pieces on two
  threads, merged and named), as a child process each, with the compiled reader and with
  ``PROFLAB_PURE_PYTHON=1`` (the driver alone), interleaved ``--repeats`` times: wall and CPU
  seconds and peak RSS (medians; the largest peak), and their ratio.

    python benchmarks/bench_export_reader.py --size-mb 500
    python benchmarks/bench_export_reader.py --export BIG.sqlite --repeats 3
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # (gen_nsys, bench_nsys_large)
DEFAULT_SOURCE = HERE.parent.parent / "shared" / "fixtures" / "nsys" / "h100_2gpu_1s.sqlite"

READ = "import sys, proflab; t = proflab.load(sys.argv[1], cache=False); print(t.gpu.height + t.cpu.height)"


def reader_queries(path: Path) -> list[tuple[str, dict, tuple, tuple]]:
    """The queries the reader runs over whole event tables of this export (sql, schema, cut,
    coded), taken from a real read of it (the pieces' rowid ranges left out)."""
    from proflab.readers import nsys_sqlite

    seen: dict[str, tuple] = {}
    fetch = nsys_sqlite._Ctx.fetch

    def recorded(self, sql, schema, finish=None, cut=(), coded=()):
        table = sql.split(" FROM ", 1)[1].split()[0]
        if table.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS", "OSRT_API")):
            seen.setdefault(table, (sql, dict(schema), cut, coded))
        return fetch(self, sql, schema, finish, cut, coded)

    nsys_sqlite._Ctx.fetch = recorded
    try:
        import proflab

        proflab.load(path, cache=False)
    finally:
        nsys_sqlite._Ctx.fetch = fetch
    return list(seen.values())


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    got = fn()
    return time.perf_counter() - t0, got


def per_table(path: Path) -> list[tuple[str, int, float, float, float]]:
    """(table, rows, SQLite stepping s, ADBC s, compiled s) of each whole-table query."""
    import adbc_driver_sqlite.dbapi as adbc
    import polars as pl

    from proflab.readers import _sqlite_native as native
    from proflab.readers._export_rows import read_only_uri

    uri = read_only_uri(path)
    con = sqlite3.connect(uri, uri=True)
    ours = native.Connections(uri)
    out = []
    for sql, schema, cut, coded in reader_queries(path):
        table = sql.split(" FROM ", 1)[1].split()[0]
        cols = ", ".join(f"c{i}" for i in range(len(schema)))
        # every column decoded by SQLite, one aggregate each (text: its length)
        aggs = ", ".join(f"total(length(c{i}))" if t == pl.String else f"total(c{i})" for i, t in enumerate(schema.values()))
        stepping, _ = _timed(lambda: con.execute(f"WITH s({cols}) AS ({sql}) SELECT count(*), {aggs} FROM s").fetchone())
        bulk = adbc.connect(uri)
        try:
            cur = bulk.cursor()
            cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": "262144"})
            driver, df = _timed(lambda: (cur.execute(sql), pl.DataFrame(cur.fetch_arrow()))[1])
            rows = df.height
            del df
            cur.close()
        finally:
            bulk.close()
        compiled, got = _timed(lambda: ours.frame(sql, schema, cut, 0, coded))
        if got is None:
            print(f"{table}: the compiled reader gave up on it", file=sys.stderr)
            compiled = float("nan")
        del got
        out.append((table, rows, stepping, driver, compiled))
    ours.close()
    con.close()
    return out


def run_child(argv: list[str], env: dict) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one child process (``bench_nsys_large.run_child``)."""
    from bench_nsys_large import run_child as run

    wall, rss, status, cpu = run(argv, os.devnull, env)
    if status:
        raise SystemExit(f"the read failed: {argv}")
    return wall, cpu, rss


def whole_reads(path: Path, repeats: int) -> dict[str, tuple[float, float, float]]:
    """Medians (the largest peak) of the whole read with the compiled reader and without."""
    env = {k: v for k, v in os.environ.items() if k != "PROFLAB_PURE_PYTHON"}
    runs: dict[str, list] = {"compiled reader": [], "ADBC driver alone": []}
    for _ in range(repeats):  # (interleaved: a busy spell of the machine hits both)
        runs["compiled reader"].append(run_child([sys.executable, "-c", READ, str(path)], env))
        runs["ADBC driver alone"].append(run_child([sys.executable, "-c", READ, str(path)], {**env, "PROFLAB_PURE_PYTHON": "1"}))
    return {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v), max(r[2] for r in v)) for k, v in runs.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the real export to scale up")
    p.add_argument("--size-mb", type=float, default=500, help="export size to generate (MB)")
    p.add_argument("--export", type=Path, help="use this export instead of generating one")
    p.add_argument("--repeats", type=int, default=1, help="runs of each whole read, interleaved; medians are printed")
    args = p.parse_args(argv)
    from proflab.readers import _sqlite_native as native

    if not native.available():
        print("the compiled column reader is not in use here (not built, no SQLite library, or PROFLAB_PURE_PYTHON)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="proflab-bench-") as tmp:
        big = args.export
        if big is None:
            if not args.source.exists():
                print(f"no source export at {args.source}; pass --source or --export", file=sys.stderr)
                return 2
            from gen_nsys import scale

            big = Path(tmp) / "big.sqlite"
            print(f"scaling {args.source.name} to {args.size_mb:.0f} MB ...", file=sys.stderr)
            scale(args.source, big, args.size_mb)
        print(f"{big.name}: {big.stat().st_size / 1e6:.0f} MB, SQLite {native.sqlite_version}")
        print(f"\n{'table':28s} {'rows':>11s} | {'SQLite':>7s} {'ADBC':>7s} {'compiled':>8s} | {'ADBC/compiled':>13s} {'compiled/SQLite':>15s}")
        for table, rows, stepping, driver, compiled in per_table(big):
            print(f"{table:28s} {rows:11,d} | {stepping:6.2f}s {driver:6.2f}s {compiled:7.2f}s | {driver / compiled:12.2f}x {compiled / stepping:14.2f}x")
        reads = whole_reads(big, args.repeats)
        print(f"\nthe whole read ({'median of ' + str(args.repeats) if args.repeats > 1 else 'one run'}; peak: the largest)")
        for name, (wall, cpu, rss) in reads.items():
            print(f"  {name:18s} {wall:6.2f} s wall  {cpu:6.2f} s CPU  {rss:7.0f} MiB")
        (w1, c1, _), (w0, c0, _) = reads["compiled reader"], reads["ADBC driver alone"]
        print(f"  the driver alone takes {w0 / w1:.2f}x the wall time and {c0 / c1:.2f}x the CPU time of the compiled reader")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
