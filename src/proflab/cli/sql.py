"""``proflab sql``: one SQL query over the normalized tables of a trace, or of a job's traces."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from proflab.cli._common import output_file, write_out
from proflab.cli._reading import loader, reading_args, reading_options
from proflab.cli._table import column_cells, flat, frame_text, table_text
from proflab.errors import UsageError

__all__ = ["add_parsers", "cmd_sql"]


SQL_FORMATS = ("table", "csv", "json", "parquet")
_SQL_SUFFIX = {".csv": "csv", ".json": "json", ".parquet": "parquet", ".pq": "parquet", ".txt": "table"}
_TABLE_ROWS = 50


def add_parsers(sub) -> None:
    q = sub.add_parser(
        "sql",
        help="SQL over a trace's tables (gpu, cpu, steps, kernels, gaps, ...)",
        description=(
            "Run one SQL query (DuckDB's dialect) over the normalized tables of a trace. "
            "Times are integer ns, sizes bytes. --tables lists every table with its columns."
        ),
        epilog='example: proflab sql run.pt.trace.json.gz "SELECT name, count(*), sum(dur_ns) FROM kernels GROUP BY name"',
    )
    q.add_argument("trace", nargs="?", metavar="TRACE",
                   help="a trace file; or a run directory or folder of rank traces: the job's tables")  # fmt: skip
    q.add_argument("query", nargs="?", metavar="SQL", help="the query; quote it")
    q.add_argument("--tables", action="store_true", help="list every table with its columns and types, then exit")
    q.add_argument("-f", "--format", choices=SQL_FORMATS, help="output format (default: table, or from -o suffix)")
    q.add_argument("-o", "--output", metavar="FILE", help="write here (atomically): .csv, .json, .parquet, .txt")
    q.add_argument("--limit", type=int, default=None, metavar="N", help="rows to output (default: 50 in table format, all otherwise; 0: all)")
    q.add_argument("--width", type=int, default=None, metavar="COLS", help="table width (default: the terminal's, or 80)")
    reading_args(q)
    q.set_defaults(func=cmd_sql)


def cmd_sql(args: argparse.Namespace) -> int:
    fmt = args.format
    if args.output and not fmt:
        fmt = _SQL_SUFFIX.get(Path(args.output).suffix.lower())
        if fmt is None:
            raise UsageError(f"{args.output}: cannot tell the format from the suffix; pass -f {'|'.join(SQL_FORMATS)}")
    fmt = fmt or "table"
    if fmt == "parquet" and not args.output:
        raise UsageError("parquet output needs -o FILE")
    if args.limit is not None and args.limit < 0:
        raise UsageError("--limit must be >= 0")
    if args.output and args.trace and Path(args.output).resolve() == Path(args.trace).resolve():
        raise UsageError(f"{args.output}: refusing to overwrite the input trace")

    text = _cached_sql_text(args, fmt)
    if text is not None:
        return write_out(args, text)
    from proflab import sql

    read = loader(args, show_progress=fmt == "table")

    def load(p):  # a query's rows carry no notes: a part read for the budget is said on stderr
        trace = read(p)
        if trace.meta.budget is not None:
            from proflab.render._text import printable

            said = next((n for n in trace.meta.notes if n.startswith("memory budget: reading")), "")
            print(f"proflab: {printable(said.split('. A larger', 1)[0])}; the query sees that part", file=sys.stderr)
        return trace

    # a folder or run directory of several rank traces: the job's tables
    ranks = None
    if args.trace and Path(args.trace).is_dir():
        from proflab.readers import expand_paths

        found = expand_paths([args.trace])
        if args.output and any(Path(args.output).resolve() == f.resolve() for f in found):
            raise UsageError(f"{args.output}: refusing to overwrite an input trace")
        ranks, args.trace = (found, None) if len(found) >= 2 else (None, str(found[0]))
    reading = reading_options(args)
    if args.tables:
        if args.query:
            raise UsageError("--tables takes no query")
        if ranks:
            df = sql.job_catalog(ranks, **reading)
        elif args.trace:
            df = sql.catalog(load(args.trace))
        else:
            import polars as pl

            df = pl.concat([sql.catalog(), sql.job_catalog()])
        if fmt == "table":
            return write_out(args, _catalog_text(df, _sql_width(args)))
        return _emit_frame(args, df, fmt)
    if not (args.trace or ranks) or not args.query:
        raise UsageError('give a trace and a query: proflab sql TRACE "SELECT ..." (or --tables)')
    df = None if ranks or args.steps or args.window else sql.query_cached(args.trace, args.query, cache=args.cache)
    if df is None:
        df = sql.query_job(ranks, args.query, **reading) if ranks else sql.query(args.trace, args.query, load=load)
    limit = args.limit if args.limit is not None else (_TABLE_ROWS if fmt == "table" else 0)
    if fmt == "table":
        return write_out(args, frame_text(df, width=_sql_width(args), limit=limit or None))
    return _emit_frame(args, df.head(limit) if limit else df, fmt)


def _sql_width(args: argparse.Namespace) -> int:
    if args.width:
        return args.width
    return os.get_terminal_size().columns if not args.output and sys.stdout.isatty() else 80


def _catalog_text(df, width: int) -> str:
    """Each table: its name, row count and description, then its columns wrapped to ``width``."""
    import textwrap

    lines = []
    for (table,), cols in df.group_by("table", maintain_order=True):
        rows = cols["rows"][0]
        head = f"{table}" + (f" ({rows} row{'s' if rows != 1 else ''})" if rows is not None else "")
        lines.extend(textwrap.wrap(f"{head}: {cols['description'][0]}", width=width, subsequent_indent="    "))
        # \0 keeps each "column TYPE" pair on one line; types may hold spaces too.
        spec = ", ".join(f"{c}\0{t.replace(' ', chr(0))}" for c, t in zip(cols["column"], cols["type"]))
        wrapped = textwrap.wrap(spec, width=width, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)
        lines.extend(line.replace("\0", " ") for line in wrapped)
        lines.append("")
    return "\n".join(lines)


def _cached_sql_text(args: argparse.Namespace, fmt: str) -> str | None:
    """The terminal table of a query over a cached trace's own tables, by DuckDB alone
    (``_sqlfast``: no polars); None when that path cannot answer it."""
    if fmt != "table" or args.tables or not args.trace or not args.query or args.steps or args.window or Path(args.trace).is_dir():
        return None
    from proflab import _sqlfast

    limit = args.limit if args.limit is not None else _TABLE_ROWS
    r = _sqlfast.cached_result(args.trace, args.query, cache=args.cache, limit=limit or None)
    if r is None:
        return None
    if not r.columns:
        return "(the statement returned no result)\n"
    cells = {c: column_cells([row[i] for row in r.rows], is_float=f) for i, (c, f) in enumerate(zip(r.columns, r.floats))}
    return table_text(r.columns, r.numeric, cells, len(r.rows), r.total, _sql_width(args))


def _emit_frame(args: argparse.Namespace, df, fmt: str) -> int:
    """CSV, JSON (an array of row objects) or Parquet: every row given, to -o or stdout."""
    if fmt == "parquet":
        with output_file(Path(args.output)) as tmp:
            df.write_parquet(tmp)
        return 0
    if fmt == "csv":
        text = flat(df).write_csv()
    else:
        text = df.write_json() + "\n"
    return write_out(args, text)
