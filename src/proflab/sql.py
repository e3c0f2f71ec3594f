"""SQL over the trace model of any input proflab reads, run by DuckDB.

::

    from proflab.sql import query
    query(trace, "SELECT name, count(*) AS n, sum(dur_ns) AS total_ns FROM kernels GROUP BY name")

Tables (``TABLES`` holds their one-line descriptions; ``catalog()`` their columns and types).
Every time is integer nanoseconds on the trace's clock (``*_ns``), every size is bytes::

    gpu             the model's device activity: kernels, memcpy, memset (+ end_ns)
    cpu             the model's host events (+ end_ns)
    steps           profiler steps: step, start_ns, end_ns, dur_ns
    devices         device properties
    kernels         one row per kernel with its launch call and operator (Context.kernel_rows)
    memcpy_summary  copies by direction and memory kinds (Context.memcpy_table)
    gaps            idle gaps with their cause (Context.gaps)
    step_breakdown  per step and device: the GPU time split (Context.step_table)
    hot_kernels     kernels grouped by name, largest total first (Context.hot_kernels)
    ranges          NVTX / record_function ranges and the GPU time they launched (Context.range_table)

A distributed job (the rank traces of one run: ``query_job``, or ``proflab sql RUN_DIR``)
has its own tables, from the cross-rank analysis (``analysis.ranks``; ``JOB_TABLES``)::

    job_ranks         one row per rank, as in the job report (ms, %)
    job_collectives   collectives matched across ranks: arrival skew, transfer, bus bandwidth
    job_waits         each matched collective on each rank: wait, transfer, exposed parts
    rank_collectives  every rank's own collective calls, matched or not

Enum columns become plain text. Only the tables a query names are built (all of them when it
names none, e.g. ``SHOW TABLES``), and they are copied into a private in-memory database.
From the columnar cache (``query_cached``), a query of the trace's own tables reads only
those tables, and keeps them as DuckDB files in the cache entry: the next query of them is
answered by DuckDB alone (``_sqlfast``); the analysis tables need the whole trace.
Before the user's SQL runs, that database is locked: no file, network or extension access,
no spilling to a temporary directory, and no setting can be changed back.

DuckDB is imported on first use so that ``proflab --help`` stays instant.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from proflab._sqlfast import _ArrowStream
from proflab._sqlfast import TABLES, lock
from proflab._sqlfast import one_line as _one_line
from proflab._sqlfast import referenced as _referenced
from proflab.errors import QueryError

if TYPE_CHECKING:  # pragma: no cover
    from proflab.model import Trace

__all__ = ["TABLES", "JOB_TABLES", "query", "query_cached", "tables", "catalog", "query_job", "job_tables", "job_catalog"]

JOB_TABLES: dict[str, str] = {
    "job_ranks": "one row per rank: step, compute, communication, wait, exposed parts, overlap (ms, %); "
    "then idle_<cause>_ms for each GPU idle cause the ranks show",
    "job_collectives": "collectives matched across ranks (group, step, order): arrival skew, transfer, bus bandwidth (ns, bytes, GB/s)",
    "job_waits": "each matched collective on each rank: wait for the last rank, transfer, the parts no compute hid (ns)",
    "rank_collectives": "every rank's own collective calls, matched or not (ns, bytes)",
}

# The analysis returns a frame without columns when there is nothing to group; SQL needs the
# columns anyway (tests check these against the real tables of a trace with GPU work).
HOT_KERNELS_SCHEMA: dict[str, pl.DataType] = {
    "name": pl.String,
    "count": pl.UInt32,
    "total_ns": pl.Int64,
    "mean_ns": pl.Float64,
    "median_ns": pl.Float64,
    "max_ns": pl.Int64,
    "devices": pl.List(pl.Int32),
    "grid": pl.String,
    "block": pl.String,
    "registers": pl.Int32,
    "shared_mem_bytes": pl.Int64,
    "op": pl.String,
    "is_comm": pl.Boolean,
    "is_gemm": pl.Boolean,
    "tensor_cores": pl.Boolean,
    "fp32_simt_by_name": pl.Boolean,
    "op_fp32": pl.Boolean,
    "share_pct": pl.Float64,
    "source": pl.String,
}
MEMCPY_SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "copy_kind": pl.String,
    "src_kind": pl.String,
    "dst_kind": pl.String,
    "count": pl.UInt32,
    "bytes": pl.Int64,
    "time_ns": pl.Int64,
    "bytes_missing": pl.Boolean,
    "gbps": pl.Float64,
    "pageable": pl.Boolean,
}
# Memcpy-only columns, always null on a kernel row.
# Result types polars cannot take as they come out of DuckDB: widened, narrowed or spelled out.
_CAST = {"HUGEINT": "BIGINT", "UHUGEINT": "UBIGINT"}
_AS_TEXT = re.compile(r"^(?:UUID|BIT|ENUM\(|UNION\(|MAP\(|VARINT|BIGNUM|TIME WITH TIME ZONE|TIMETZ|GEOMETRY)")
_POLARS_TYPE = {
    "BOOLEAN": pl.Boolean,
    "TINYINT": pl.Int8,
    "SMALLINT": pl.Int16,
    "INTEGER": pl.Int32,
    "BIGINT": pl.Int64,
    "UTINYINT": pl.UInt8,
    "USMALLINT": pl.UInt16,
    "UINTEGER": pl.UInt32,
    "UBIGINT": pl.UInt64,
    "FLOAT": pl.Float32,
    "DOUBLE": pl.Float64,
    "VARCHAR": pl.String,
}
_RESULT = "_proflab_result"


# -- the tables --------------------------------------------------------------------------------


def _plain(df: pl.DataFrame) -> pl.DataFrame:
    """Enum and categorical columns as text: what SQL users compare against."""
    return df.with_columns(
        pl.col(c).cast(pl.String) for c, t in df.schema.items() if isinstance(t, (pl.Enum, pl.Categorical))
    )


def _with_end(df: pl.DataFrame) -> pl.DataFrame:
    """``end_ns = start_ns + dur_ns``, placed right after ``dur_ns``."""
    cols = []
    for c in df.columns:
        cols.append(pl.col(c))
        if c == "dur_ns":
            cols.append((pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    return df.select(cols)


def _or_empty(df: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return df if df.width else pl.DataFrame(schema=schema)


# the trace's own tables as SQL sees them, from the model's
_RAW = {
    "gpu": lambda df: _plain(_with_end(df)),
    "cpu": lambda df: _plain(_with_end(df)),
    "steps": lambda df: df.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")),
    "devices": lambda df: df,
}


def _builders(trace: Trace) -> dict[str, Callable[[], pl.DataFrame]]:
    from proflab.analysis import Context

    ctx = Context(trace)
    return {
        **{name: (lambda name=name: _RAW[name](getattr(trace, name))) for name in _RAW},
        "kernels": lambda: _plain(_with_end(ctx.kernel_rows)),
        "memcpy_summary": lambda: _or_empty(_plain(ctx.memcpy_table), MEMCPY_SUMMARY_SCHEMA),
        "gaps": lambda: _plain(_gaps(ctx)),
        "step_breakdown": lambda: _with_end(ctx.step_table),
        "hot_kernels": lambda: _or_empty(_plain(ctx.hot_kernels(None)), HOT_KERNELS_SCHEMA),
        "ranges": lambda: ctx.range_table,
    }


def _gaps(ctx) -> pl.DataFrame:
    """The idle gaps, built as report assembly builds them (``Context.free_device_levels``)."""
    ctx.free_device_levels()
    return ctx.gaps


def _as_trace(trace: Trace | str | Path) -> Trace:
    if isinstance(trace, (str, Path)):
        from proflab.readers import load

        return load(trace)
    return trace


def _empty_trace() -> Trace:
    from proflab.model import Trace, TraceMeta
    from proflab.model.trace import (
        CPU_SCHEMA,
        DEVICE_SCHEMA,
        GPU_SCHEMA,
        STEP_SCHEMA,
        empty,
    )

    return Trace(
        gpu=empty(GPU_SCHEMA),
        cpu=empty(CPU_SCHEMA),
        steps=empty(STEP_SCHEMA),
        devices=empty(DEVICE_SCHEMA),
        meta=TraceMeta(source="", format="none"),
    )


def tables(trace: Trace | str | Path) -> dict[str, pl.DataFrame]:
    """Every table SQL sees, by name, as polars frames (times in ns, sizes in bytes)."""
    return {name: build() for name, build in _builders(_as_trace(trace)).items()}


# -- DuckDB ------------------------------------------------------------------------------------


def _connect(frames: dict[str, pl.DataFrame]):
    """A private in-memory database holding ``frames`` as tables, locked against the outside;
    ``frames`` is emptied as they are copied in."""
    import duckdb

    con = duckdb.connect(":memory:")
    try:
        viewed = _rescannable(duckdb.__version__)
        for name in list(frames):
            if viewed:  # read where it is: no copy of the table beside the frame
                con.register(name, _ArrowStream(frames.pop(name)))
                continue
            # Copied in: before DuckDB 1.5 a registered Arrow stream can be scanned only once,
            # and a query may read a table twice (a self-join). Each frame leaves ``frames`` as
            # it is copied: where the caller holds nothing else, it is freed.
            con.register("_proflab_load", _ArrowStream(frames.pop(name)))
            con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM _proflab_load')
            con.unregister("_proflab_load")
        lock(con)
    except BaseException:
        con.close()
        raise
    return con


def _rescannable(version: str) -> bool:
    """Whether this DuckDB scans a registered Arrow stream more than once (from 1.5: 1.4.3
    said "The ArrowArrayStream was already released" at a self-join's second scan). Then the
    frames are registered, not copied: ``proflab sql`` over the host table of the 1 GB export
    peaked at 2.5 GiB with the copy."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return m is not None and (int(m.group(1)), int(m.group(2))) >= (1, 5)


def _polars_type(duck_type: str) -> pl.DataType | None:
    """The polars type of a DuckDB type: primitives, lists and structs of them; else None."""
    t = duck_type.strip()
    if t in _POLARS_TYPE:
        return _POLARS_TYPE[t]
    m = re.fullmatch(r"(.+)\[\d*\]", t)
    if m:
        inner = _polars_type(m.group(1))
        return pl.List(inner) if inner is not None else None
    m = re.fullmatch(r"STRUCT\((.*)\)", t)
    if m:
        fields = {}
        for part in _top_level_split(m.group(1)):
            fm = re.fullmatch(r'\s*("(?:[^"]|"")*"|\S+)\s+(.+)', part)
            inner = _polars_type(fm.group(2)) if fm else None
            if inner is None:
                return None
            key = fm.group(1)
            fields[key[1:-1].replace('""', '"') if key.startswith('"') else key] = inner
        return pl.Struct(fields)
    return None


def _top_level_split(text: str) -> list[str]:
    parts, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "([":
            depth += 1
        elif not quoted and ch in ")]":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _column(name: str, values: Any, duck_type: str) -> pl.Series:
    import numpy as np

    dtype = _polars_type(duck_type)
    if isinstance(values, np.ndarray) and values.dtype != object:
        # Nulls come as a numpy mask; not every polars release reads masks, so apply it here.
        s = pl.Series(name, np.ma.getdata(values), dtype=dtype)
        missing = np.flatnonzero(np.ma.getmaskarray(values))
        return s.scatter(missing, None) if missing.size else s
    # Text and nested values come as Python objects (lists as numpy arrays inside).
    items = [_py(v) for v in (values.tolist() if isinstance(values, np.ndarray) else values)]
    try:
        s = pl.Series(name, items, dtype=dtype, strict=False)
    except (TypeError, ValueError, pl.exceptions.PolarsError):
        s = pl.Series(name, [None if v is None else str(v) for v in items], dtype=pl.String)
    if s.dtype == pl.Object:
        s = pl.Series(name, [None if v is None else str(v) for v in items], dtype=pl.String)
    return s


def _py(v: Any) -> Any:
    import numpy as np

    if isinstance(v, np.ndarray):  # a masked array's tolist() gives None where masked
        return [_py(x) for x in v.tolist()]
    if isinstance(v, dict):
        return {k: _py(x) for k, x in v.items()}
    if isinstance(v, np.generic):
        return v.item()
    return v


def _fetch(con, sql: str) -> pl.DataFrame:
    """Run ``sql`` once and return its result as a polars frame.

    Read through numpy, column by column: DuckDB's Arrow export to polars is avoided because
    DuckDB 2.0 reports leaked references at interpreter exit after it."""
    rel = con.sql(sql)
    if rel is None:  # a statement without a result (CREATE, SET, ...)
        return pl.DataFrame()
    names, types = list(rel.columns), [str(t) for t in rel.types]
    targets = [_CAST.get(t) or ("VARCHAR" if _AS_TEXT.match(t) else None) for t in types]
    if any(targets):
        if len(set(names)) < len(names):
            # Casts need unique names: a table made from the result gets them (a, a_1, ...).
            rel.create(_RESULT)
            rel = con.table(_RESULT)
            names = list(rel.columns)
        quoted = ['"' + n.replace('"', '""') + '"' for n in names]
        rel = rel.project(", ".join(f"CAST({q} AS {t}) AS {q}" if t else q for q, t in zip(quoted, targets)))
    arrays = rel.fetchnumpy()
    # fetchnumpy makes repeated names unique the same way; its keys keep the result's order.
    final = [t or d for t, d in zip(targets, types)]
    return pl.DataFrame([_column(n, a, t) for (n, a), t in zip(arrays.items(), final)])


def query(trace: Trace | str | Path, sql: str, *, load: Callable[[Any], Trace] | None = None) -> pl.DataFrame:
    """The result of ``sql`` (DuckDB's dialect) over the tables of ``trace`` (see module doc).
    A path is read with ``load`` (default ``proflab.readers.load``), and then held only until
    the tables the query names are built: what DuckDB copies in never sits beside the whole
    trace (the kernels table of the 1 GB export: 1.9 -> 1.3 GiB).

    Raises :class:`~proflab.errors.QueryError` with DuckDB's message on one line for SQL that
    does not parse, names an unknown table or column, fails at run time, or reaches for a
    file, the network or an extension."""
    if not sql or not sql.strip():
        raise QueryError("empty query")
    builders = _builders(load(trace) if load is not None and isinstance(trace, (str, Path)) else _as_trace(trace))
    del trace
    return _run(builders, TABLES, sql)


def query_cached(path: str | Path, sql: str, *, cache: bool | None = None) -> pl.DataFrame | None:
    """``query(path, sql)`` answered from the columnar cache when the trace has a cache
    entry: its own tables (gpu, cpu, steps, devices) are read from the entry, only those the
    query names, and a derived table (kernels, gaps, ...) is built from them; each is then
    kept in the entry for ``_sqlfast``. None when there is no entry (the caller reads the
    trace)."""
    from proflab.readers import _cache

    if not sql or not sql.strip():
        raise QueryError("empty query")
    p = Path(path)
    names = _referenced(sql, TABLES)
    if not _cache.enabled(p, cache):
        return None
    entry = _cache.scan_entry(p)
    if entry is None:
        return None
    try:
        if set(names) <= _RAW.keys():  # only the tables named, straight from the entry
            frames = {name: _RAW[name](entry.collect(name)) for name in names}
        else:  # an analysis table needs the whole trace: every table from it, read once
            from proflab.readers import load

            build = _builders(load(p, cache=cache))
            frames = {name: build[name]() for name in names}
    except (OSError, pl.exceptions.PolarsError, TypeError, IndexError):
        _cache.drop(p)  # damaged after all: the caller reads the trace again
        return None
    from proflab._sqlfast import store_table

    for name, df in frames.items():  # the next query of these tables needs no polars (_sqlfast)
        store_table(entry.dir, name, df)
    return _run({name: (lambda df=df: df) for name, df in frames.items()}, TABLES, sql)


def _run(builders: dict[str, Callable[[], pl.DataFrame]], names: dict[str, str], sql: str) -> pl.DataFrame:
    """``sql`` over the tables it names, each built by its builder. The builders are taken out
    of ``builders`` as they run (with them goes what they hold: the trace and its analysis),
    and ``_connect`` copies the frames into DuckDB one at a time, each dropped once copied."""
    import duckdb

    frames = {name: builders.pop(name)() for name in _referenced(sql, names)}
    builders.clear()
    con = _connect(frames)
    try:
        return _fetch(con, sql)
    except duckdb.Error as e:
        raise QueryError(_one_line(e, names)) from e
    finally:
        con.close()


def catalog(trace: Trace | str | Path | None = None) -> pl.DataFrame:
    """Every table's columns with their SQL types: ``table``, ``description``, ``column``,
    ``type`` and ``rows`` (the table's row count; null when no trace is given)."""
    if trace is None:
        return _catalog(tables(_empty_trace()), TABLES, counted=False)
    return _catalog(tables(trace), TABLES, counted=True)


def _catalog(frames: dict[str, pl.DataFrame], names: dict[str, str], *, counted: bool) -> pl.DataFrame:
    con = _connect(dict(frames))  # (``_connect`` empties the dict it is given)
    try:
        rows = []
        for name, df in frames.items():
            for column, duck_type, *_ in con.execute(f'DESCRIBE "{name}"').fetchall():
                rows.append((name, names[name], column, duck_type, df.height if counted else None))
    finally:
        con.close()
    return pl.DataFrame(
        rows,
        schema={"table": pl.String, "description": pl.String, "column": pl.String, "type": pl.String, "rows": pl.Int64},
        orient="row",
    )


# -- a distributed job -------------------------------------------------------------------------


def job_tables(paths: list[str | Path] | None, **options: Any) -> dict[str, pl.DataFrame]:
    """The job tables (``JOB_TABLES``) of the rank traces ``paths`` (one per rank, as
    ``proflab analyze`` takes them); empty tables with their columns when ``paths`` is None.
    ``options``: rank_task's (``cache``, ``steps``, ``window``, ``bare_step_ms``). Raises
    UsageError when the traces are not the ranks of one job."""
    from proflab.analysis.ranks import CALL_SCHEMA, COLLECTIVE_SCHEMA, RANK_SCHEMA, WAITS_SCHEMA

    calls_schema = {"rank": pl.Int64, **CALL_SCHEMA}
    if paths is None:
        return {
            "job_ranks": pl.DataFrame(schema=RANK_SCHEMA),
            "job_collectives": pl.DataFrame(schema=COLLECTIVE_SCHEMA),
            "job_waits": pl.DataFrame(schema=WAITS_SCHEMA),
            "rank_collectives": pl.DataFrame(schema=calls_schema),
        }
    import importlib.util

    from proflab.report import job as jobs
    from proflab.analysis.ranks import job_tables as cross_rank
    from proflab.errors import UsageError

    try:
        # many ranks go to Dask as in `proflab analyze`, here when it is not installed
        summaries, _, _ = jobs.rank_summaries(paths, options, in_process=importlib.util.find_spec("distributed") is None)
    except jobs.NotAJob as e:
        raise UsageError(f"not one job's rank traces: {e}") from None
    t = cross_rank(summaries)
    calls = [s.calls.with_columns(pl.lit(s.rank, pl.Int64).alias("rank")).select(list(calls_schema)) for s in summaries]
    return {
        "job_ranks": t.ranks,
        "job_collectives": t.collectives,
        "job_waits": t.waits.select(list(WAITS_SCHEMA)).cast(WAITS_SCHEMA),
        "rank_collectives": pl.concat(calls).sort("rank", "start_ns") if calls else pl.DataFrame(schema=calls_schema),
    }


def query_job(paths: list[str | Path], sql: str, **options: Any) -> pl.DataFrame:
    """The result of ``sql`` over the job tables of the rank traces ``paths`` (see module doc)."""
    if not sql or not sql.strip():
        raise QueryError("empty query")
    frames = job_tables(paths, **options)
    return _run({name: (lambda df=df: df) for name, df in frames.items()}, JOB_TABLES, sql)


def job_catalog(paths: list[str | Path] | None = None, **options: Any) -> pl.DataFrame:
    """The job tables' columns, as ``catalog`` (``rows`` null when no traces are given)."""
    return _catalog(job_tables(paths, **options), JOB_TABLES, counted=paths is not None)
