"""``proflab sql`` on a cached trace without polars: DuckDB reads the trace's tables from
its cache entry and the result goes straight to the terminal table.

The first query of a cached trace's tables goes through ``proflab.sql`` (polars), which
also writes each table it read or built, as SQL sees it (enums as text, ``end_ns`` added),
as a one-table DuckDB database ``sql-<table>.<version>.duckdb`` in the trace's columnar
cache entry (``readers._cache``): the trace's own tables (gpu, cpu, steps, devices) and the
derived ones (kernels, gaps, ranges...; their version is a hash of the whole package, which
decides them). A later query that names only tables kept there is answered here: the files
are attached read-only to a private in-memory database, which is then locked exactly as ``proflab.sql`` locks its own (no file, network
or extension access, no setting changed back) before the user's SQL runs. Importing DuckDB
is the cost that remains (polars and numpy are never imported).

Only the terminal table is served here, and only results of plain types (integers, floats,
booleans, text; 128-bit integers as 64-bit ones, as ``proflab.sql`` casts them) with distinct
column names; anything else returns None and the caller takes the polars path, which gives
the same rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from proflab.errors import QueryError

__all__ = ["TABLES", "Result", "cached_result", "referenced", "one_line", "lock", "table_path", "store_table"]

TABLES: dict[str, str] = {
    "gpu": "kernels, memcpy and memset on the devices (ns, bytes)",
    "cpu": "host ops, annotations, Python frames, CUDA API calls (ns)",
    "steps": "profiler steps (ProfilerStep#N), host-side windows (ns)",
    "devices": "device properties as the trace reports them",
    "kernels": "one row per kernel with its launch call and operator (ns)",
    "memcpy_summary": "copies by direction and memory kinds (bytes, ns, GB/s)",
    "gaps": "GPU idle gaps and their cause (ns)",
    "step_breakdown": "GPU time per step and device, split by kind (ns)",
    "hot_kernels": "kernels by name, largest total time first (ns, %)",
    "ranges": "NVTX/record_function ranges and GPU time launched (ns)",
}
RAW_TABLES = ("gpu", "cpu", "steps", "devices")  # the trace's own tables: kept in the cache

# Words that query DuckDB's catalog: such a query should see every table.
CATALOG_WORDS = {"information_schema", "duckdb_tables", "duckdb_columns", "duckdb_views", "show", "pragma"}

# DuckDB result types served here: (numeric, float) as the terminal table aligns them;
# 128-bit integers are cast to 64-bit ones as ``proflab.sql`` casts them
_PLAIN = {
    "BOOLEAN": (False, False),
    "TINYINT": (True, False),
    "SMALLINT": (True, False),
    "INTEGER": (True, False),
    "BIGINT": (True, False),
    "UTINYINT": (True, False),
    "USMALLINT": (True, False),
    "UINTEGER": (True, False),
    "UBIGINT": (True, False),
    "HUGEINT": (True, False),
    "UHUGEINT": (True, False),
    "FLOAT": (True, True),
    "DOUBLE": (True, True),
    "VARCHAR": (False, False),
}
_CAST = {"HUGEINT": "BIGINT", "UHUGEINT": "UBIGINT"}
_RESULT = "_proflab_result"


def referenced(sql: str, names: dict[str, str] = TABLES) -> list[str]:
    """The tables a query may read: every one whose name appears in it as a word, or all."""
    words = set(re.findall(r"[a-z_][a-z0-9_]*", sql.lower()))
    named = [t for t in names if t in words]
    return list(names) if not named or words & CATALOG_WORDS else named


def one_line(e: BaseException, names: dict[str, str] = TABLES) -> str:
    """DuckDB's message on one line: caret-marker lines dropped, the rest joined."""
    lines = [ln.strip() for ln in str(e).splitlines()]
    text = " ".join(ln for ln in lines if ln and set(ln) - set("^ "))
    # DuckDB suggests its own catalog tables ("Did you mean pg_enum?"): name ours instead.
    m = re.search(r'Did you mean "([^"]+)"\?', text)
    if m and m.group(1) not in names:
        text = text[: m.start()].rstrip()
    if "Table with name" in text and "does not exist" in text:
        text += f" (tables: {', '.join(names)}; `proflab sql --tables` lists their columns)"
    return text


def lock(con) -> None:
    """Lock a private database before user SQL runs in it."""
    # The temporary directory is always readable and writable, even without external
    # access: with none, user SQL can touch no file at all (large sorts stay in memory).
    con.execute("SET temp_directory = ''")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


@lru_cache(maxsize=1)
def _version() -> str:
    """A hash of the code that decides the Parquet tables (how SQL sees the model's tables)."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in (here / "sql.py", here / "_sqlfast.py"):
        try:
            h.update(f.read_bytes())
        except OSError:
            pass
    return h.hexdigest()[:12]


def table_path(entry: Path, name: str) -> Path:
    """Where a table is kept in the cache entry: the trace's own tables under a hash of the
    SQL code, the derived ones (kernels, gaps, ranges...) under a hash of every source of the
    package, since the analysis decides them."""
    if name in RAW_TABLES:
        return entry / f"sql-{name}.{_version()}.duckdb"
    from proflab.readers._cachedir import analysis_version

    return entry / f"sql-{name}.a{analysis_version()[:12]}.duckdb"


class _ArrowStream:
    """Hands a polars frame to DuckDB through the Arrow PyCapsule interface (no pyarrow)."""

    def __init__(self, df) -> None:
        self._df = df

    def __arrow_c_stream__(self, requested_schema=None):
        return self._df.__arrow_c_stream__(requested_schema)


def store_table(entry: Path, name: str, df) -> None:
    """Keep ``df`` (a polars frame: the table as SQL sees it) in the cache entry as a DuckDB
    database of one table, made as ``proflab.sql`` makes its in-memory tables. Written under
    a temporary name and renamed into place; any failure is not an error."""
    target = table_path(entry, name)
    if target.exists():
        return
    import duckdb

    tmp = entry / f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        con = duckdb.connect(str(tmp))
        try:
            con.register("_proflab_load", _ArrowStream(df))
            con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM _proflab_load')
            con.unregister("_proflab_load")
        finally:
            con.close()
        os.replace(tmp, target)
    except Exception:
        pass
    finally:
        for f in (tmp, Path(f"{tmp}.wal")):
            try:
                f.unlink()
            except OSError:
                pass


@dataclass
class Result:
    """A query result for the terminal table: column names, whether each is numeric and
    float, the first rows, and how many rows there are in all. ``columns`` is empty for a
    statement that returned no result."""

    columns: list[str]
    numeric: list[bool]
    floats: list[bool]
    rows: list[tuple]
    total: int


def _entry(path: Path, cache: bool | None) -> Path | None:
    """The trace's columnar cache entry, when there is a current one."""
    from proflab.readers._cachedir import cache_root, enabled, reader_version, touch, trace_key

    if not enabled(path, cache):
        return None
    key = trace_key(path)
    if key is None:
        return None
    d = cache_root() / key
    try:
        if json.loads((d / "meta.json").read_text()).get("_version") != reader_version():
            return None
    except (OSError, ValueError, AttributeError):
        return None
    touch(d)
    return d


def cached_result(path: str | Path, sql: str, *, cache: bool | None = None, limit: int | None = None) -> Result | None:
    """The result of ``sql`` over a cached trace's tables, its first ``limit`` rows (all when
    None), from the DuckDB tables kept in its cache entry; None when this path cannot answer
    (no entry, a named table not kept yet, a result type it does not serve). Raises
    QueryError as ``proflab.sql.query`` does."""
    if not sql or not sql.strip():
        raise QueryError("empty query")
    names = referenced(sql)
    d = _entry(Path(path), cache)
    if d is None:
        return None
    files = {name: table_path(d, name) for name in names}
    if not all(f.is_file() for f in files.values()):
        return None
    import duckdb

    con = duckdb.connect(":memory:")
    try:
        try:
            # attached read-only, each table shown as a view: a query reads only the columns
            # it needs, and after the lock nothing can be attached, written or detached into
            for name, f in files.items():
                con.execute(f"ATTACH '{_quoted(f)}' AS \"_proflab_{name}\" (READ_ONLY)")
                con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM "_proflab_{name}"."{name}"')
        except duckdb.Error:
            return None  # a damaged file: the polars path reads the cache entry
        lock(con)
        try:
            return _result(con, sql, limit)
        except duckdb.Error as e:
            raise QueryError(one_line(e)) from e
    finally:
        con.close()


def _quoted(p: Path) -> str:
    return str(p).replace("'", "''")


def _result(con, sql: str, limit: int | None) -> Result | None:
    rel = con.sql(sql)
    if rel is None:  # a statement without a result (CREATE, SET, ...)
        return Result([], [], [], [], 0)
    names, types = list(rel.columns), [str(t) for t in rel.types]
    if len(set(names)) < len(names) or any(t not in _PLAIN for t in types):
        return None
    quoted = ['"' + n.replace('"', '""') + '"' for n in names]
    if any(t in _CAST for t in types):
        rel = rel.project(", ".join(f"CAST({q} AS {_CAST[t]}) AS {q}" if t in _CAST else q for q, t in zip(quoted, types)))
    rel.create(_RESULT)
    total = con.execute(f"SELECT count(*) FROM {_RESULT}").fetchone()[0]
    rows = con.execute(f"SELECT * FROM {_RESULT}" + (f" LIMIT {int(limit)}" if limit else "")).fetchall()
    return Result(names, [_PLAIN[t][0] for t in types], [_PLAIN[t][1] for t in types], rows, total)
