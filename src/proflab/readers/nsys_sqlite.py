"""Reader for Nsight Systems SQLite exports (schema 3.x) and, through ``nsys export``,
``.nsys-rep`` reports.

What an export holds and how it maps onto the model:

- tables exist only when they have data; names are ids into ``StringIds``;
- ``CUPTI_ACTIVITY_KIND_KERNEL`` / ``_MEMCPY`` / ``_MEMSET`` -> ``gpu`` (copy and memory kinds
  from their enums: pageable, pinned, device, managed...);
- ``CUPTI_ACTIVITY_KIND_RUNTIME`` / ``_DRIVER`` -> ``cpu`` runtime/driver calls (names lose
  their version suffix: ``cudaMemcpyAsync_v3020`` -> ``cudaMemcpyAsync``);
- ``NVTX_EVENTS`` push/pop and start/end ranges -> ``cpu`` annotations, named
  ``domain:range`` outside the default domain (``ProfilerStep#N`` ranges become steps);
  ``OSRT_API`` -> ``cpu`` OS-runtime calls;
- ``TARGET_INFO_GPU`` -> ``devices`` when present.

CUPTI correlation ids are unique only within a process, and an export can hold several: the
model's ``correlation`` is ``pid << 32 | correlationId`` so joins never cross processes.
``globalTid`` packs the process and thread ids (pid in bits 24-47, tid in bits 0-23).

Exports are large (several GB is a real case), so memory follows the events kept, not the
file: tables are read straight into Arrow columns (no Python object per value), half a
million rows at a time, on two threads, and only the columns the model needs are selected.
The compiled column reader (``_sqlite_native``) steps through SQLite's rows in C; where it is
not built, or gives up on a piece (any value but an integer or UTF-8 text), the ADBC SQLite
driver reads that piece. Names travel as UInt32 codes into one small dictionary of texts: a StringIds id
becomes a code by an integer lookup, each string cleaned once when first met; text stored in
a row (NVTX) and names built from enums (copies, memsets) enter it once per distinct value
of each chunk. The per-table frames are merged into time order one column at a time, and only
then do the codes become text, by one gather from the dictionary: a 175-byte kernel name
costs a 16-byte view per row, never a copy, and no name is joined as text per row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl

from proflab.errors import BackendUnavailable, CollectError, CorruptInput, EmptyTrace, SchemaError, UnsupportedFormat
from proflab.model.trace import (
    COMM_KERNEL_PATTERN,
    COPY_KINDS,
    CPU_SCHEMA,
    DEVICE_SCHEMA,
    GPU_SCHEMA,
    MEMORY_KINDS,
    NextWork,
    Trace,
    TraceMeta,
    counts_only,
    steps_from_annotations,
)
from proflab.model.slicing import SliceSpec, ahead_condition, selected_steps, slice_trace, steps_bounds, window_bounds
from proflab.readers import _progress as progress
from proflab.readers import _sqlite_native as native
from proflab.readers._export_rows import (
    EVENT_TABLES,
    SQLITE_MAGIC,
    event_table_rows,
    read_only_uri,
    rowid_bounds,
    sniff,
    table_rows,
)
from proflab.readers._merge import merge_by_start

__all__ = ["sniff", "read", "table_rows", "SQLITE_MAGIC"]

_BATCH_ROWS = 262_144  # rows per Arrow batch from the driver; also its type-inference window
_CHUNK_ROWS = 1 << 19  # rows of a table read and finished at a time
_MAX_PIECES = 1 << 16  # pieces of a table at most (34 G rowids: an export's rowids run from 1)
_READ_THREADS = 2  # threads reading a large table's next pieces (SQLite runs without the GIL)

# ENUM_CUDA_MEMCPY_OPER and ENUM_CUDA_MEM_KIND ids (stable across nsys versions).
_COPY_KIND = {1: "HtoD", 2: "DtoH", 8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
_MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device", 6: "Managed"}
_NVTX_RANGES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange


def read(path: str | Path, part: SliceSpec | None = None, *, budget: int | None = None) -> Trace:
    """Read an export (or convert a ``.nsys-rep`` with nsys first). Raises InputError subclasses.

    ``part`` (``--steps`` / ``--window``): only that part, cut inside SQLite (``_read_part``),
    so memory follows the part, not the export; the trace is already sliced. ``budget``
    (bytes): an export whose whole analysis is estimated to need more is read in a part that
    fits (``readers.budget``), and its notes say so; a ``part`` asked for is read as it is."""
    path = Path(path)
    if path.suffix == ".nsys-rep" or (path.exists() and not sniff(path) and _is_nsys_rep(path)):
        return slice_trace(_read_report(path, None if part is not None else budget), part)
    with _opened(path) as ctx:
        return _read(path, ctx, part, budget)


def read_parts(path: str | Path, budget: int) -> Iterator[Trace]:
    """Every event of the export in consecutive parts that each fit ``budget``
    (``readers.budget.parts``), each read as ``--steps`` / ``--window`` read a part; the
    whole export, once, where its whole read fits. A ``.nsys-rep`` is converted first."""
    path = Path(path)
    if path.suffix == ".nsys-rep" or (path.exists() and not sniff(path) and _is_nsys_rep(path)):
        with _exported(path) as out:
            for trace in read_parts(out, budget):
                yield Trace(trace.gpu, trace.cpu, trace.steps, trace.devices, _with_source(trace.meta, path))
        return
    from proflab.readers import budget as limits

    specs = None
    with _opened(path) as ctx:
        rows = event_table_rows(ctx.con, ctx.tables)
        if limits.estimate(rows) > budget:
            whole = _Whole.of(ctx)
            if whole.origin is not None:
                specs = limits.parts(ctx.con, rows, budget, whole.steps, whole.origin)
            if specs is not None and (cuts := limits.cut_times(specs, whole.origin, whole.steps)):
                specs = limits.by_launch(specs, *ctx.latest_launches(cuts))
            after = ctx.next_work(specs) if specs is not None else []
        if specs is None:
            trace = _read_tables(path, ctx)
    if specs is None:
        yield trace
        return
    def read(spec: SliceSpec) -> Trace:
        with _opened(path) as ctx:
            return _read_part(path, ctx, spec, whole)

    yield from limits.each_part(specs, after, read, budget,
                                EmptyTrace(path, "Nsight Systems export with no CUDA, NVTX or OS runtime events in any of its parts"))


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[_Ctx]:
    """The reader's context over an export opened read-only; SQLite's errors become one
    line naming the file."""
    import adbc_driver_sqlite.dbapi as adbc

    uri = read_only_uri(path)
    try:
        con = sqlite3.connect(uri, uri=True)
        bulk = adbc.connect(uri)
    except (sqlite3.Error, adbc.Error) as e:
        raise CorruptInput(path, f"cannot open as SQLite: {e}") from e
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            raise EmptyTrace(path, "SQLite database with no tables")
        if "StringIds" not in tables and not any(t.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_")) for t in tables):
            raise UnsupportedFormat(path, "SQLite database, but not an Nsight Systems export (no StringIds or CUPTI tables)")
        ctx = _Ctx(path, con, bulk, tables, lambda: adbc.connect(uri))
        if native.available():
            ctx.native = native.Connections(uri)
        try:
            yield ctx
        finally:
            ctx.close_readers()
    except (sqlite3.DatabaseError, adbc.DatabaseError) as e:
        raise CorruptInput(path, f"damaged or truncated SQLite database ({_first_line(e)})") from e
    except UnicodeDecodeError as e:  # a damaged page under a table or column name
        raise CorruptInput(path, f"damaged SQLite database (text that is not UTF-8: byte 0x{e.object[e.start]:02x})") from e
    finally:
        con.close()
        bulk.close()


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _is_nsys_rep(path: Path) -> bool:
    return path.suffix in (".nsys-rep", ".qdrep")


def _next_part_rows(spec: SliceSpec) -> str | None:
    """The SQL condition on a GPU table's rows for the work of a part by launch: its
    correlation ids (``SliceSpec.correlations``)."""
    if not spec.correlations:
        return None
    pid = "(globalPid / 16777216) % 16777216"
    return "(" + " OR ".join(
        f"({pid} = {k}" + (f" AND correlationId > {a - (k << 32)}" if a is not None else "")
        + (f" AND correlationId <= {b - (k << 32)}" if b is not None else "") + ")"
        for k, a, b in spec.correlations) + ")"  # fmt: skip


def _read_report(path: Path, budget: int | None) -> Trace:
    with _exported(path) as out:
        trace = read(out, budget=budget)
    return Trace(trace.gpu, trace.cpu, trace.steps, trace.devices, _with_source(trace.meta, path))


@contextlib.contextmanager
def _exported(path: Path) -> Iterator[Path]:
    """A ``.nsys-rep`` converted by nsys to an SQLite export in a temporary folder."""
    from proflab.readers import _nsys_export as nsys

    with tempfile.TemporaryDirectory(prefix="proflab-nsys-") as tmp:
        try:
            out = nsys.export_sqlite(path, Path(tmp) / (path.stem + ".sqlite"))
        except BackendUnavailable as e:
            raise UnsupportedFormat(
                path,
                "an Nsight Systems report needs nsys to convert it; install Nsight Systems, or run "
                "`nsys export --type sqlite <report>` where it is installed and pass the .sqlite file",
            ) from e
        except CollectError as e:
            raise UnsupportedFormat(path, f"nsys could not export it to SQLite ({str(e).removeprefix(f'{path}: ')})") from e
        yield out


def _with_source(meta: TraceMeta, path: Path) -> TraceMeta:
    return dataclasses.replace(meta, source=str(path), format="nsys-rep")


def _read(path: Path, ctx: _Ctx, part: SliceSpec | None = None, budget: int | None = None) -> Trace:
    if part is None and budget is not None:
        trace = _read_within(path, ctx, budget)
        if trace is not None:
            return trace
    return _read_tables(path, ctx) if part is None else _read_part(path, ctx, part)


def _read_within(path: Path, ctx: _Ctx, budget: int) -> Trace | None:
    """The part of the export that fits ``budget`` (``readers.budget``), with notes that say
    what reading it whole would need, what was read, and how far the part is like the whole;
    None when the whole read fits."""
    from proflab.readers import budget as limits

    rows = event_table_rows(ctx.con, ctx.tables)
    if limits.estimate(rows) <= budget:
        return None
    whole = _Whole.of(ctx)
    plan = limits.plan(ctx.con, rows, budget, whole.steps)
    if plan is None or whole.origin is None:
        return None  # nothing dated: the whole read says what the export holds
    trace = _read_part(path, ctx, plan.part(whole.origin), whole)
    like = limits.likeness(ctx, plan.lo_ns, plan.hi_ns)
    notes = limits.notes(path.name, plan, trace.gpu.height + trace.cpu.height, whole.events, like, steps=whole.steps)
    return limits.noted(trace, notes, budget)


@dataclasses.dataclass(frozen=True)
class _Whole:
    """What a part's read needs of the whole export, from SQLite: its ProfilerStep ranges,
    how many events a whole read keeps, and the first one's start."""

    steps: pl.DataFrame
    events: int
    origin: int | None

    @classmethod
    def of(cls, ctx: _Ctx) -> _Whole:
        ctx.host_where = ctx.step_ranges()
        steps = steps_from_annotations(_timed(ctx.decode(ctx.nvtx()), "host", []))
        ctx.host_where = None
        return cls(steps, *ctx.extent())


def _read_part(path: Path, ctx: _Ctx, part: SliceSpec, whole: _Whole | None = None) -> Trace:
    """The part ``part`` selects, every table filtered in its SQL to the rows that can belong
    to it (those overlapping the part's host window; with ``--steps``, GPU work in the
    correlation id range of the host calls kept), then cut exactly by ``slice_trace`` as a
    whole trace would be. ``whole``: the export's steps, event count and first event
    (``_Whole``), read first in SQLite when not given."""
    source = str(path)
    whole = whole or _Whole.of(ctx)
    all_steps, events, origin = whole.steps, whole.events, whole.origin
    if part.steps is not None:
        sel = selected_steps(all_steps, part, source)
        (lo, hi), first = steps_bounds(sel, part, all_steps), int(sel["start_ns"].min())
    else:
        (lo, hi), first = window_bounds(part, origin, source), origin
    ctx.host_where = ctx.gpu_where = f"start < {hi} AND (end > {lo} OR start >= {lo})"
    ahead = ahead_condition(part, lo, hi, lambda tid, until: f"(globalTid % 16777216 = {int(tid)} AND start < {int(until)})",
                            lambda a, b: f"{a} OR {b}", first=first)
    if ahead is not None:  # the next part's host events before its first launches, too
        ctx.host_where = f"({ctx.host_where}) OR ((end > {hi} OR start >= {hi}) AND ({ahead}))"
    if part.correlations is not None:  # a part of every event's: the work launched in it
        # (rows of any process whose id is in one of the processes' ranges: slicing keeps
        # each process's own; and by time, the work of processes with no launches)
        ids = ["correlationId IS NOT NULL"]
        firsts = [None if a is None else a - (k << 32) for k, a, _ in part.correlations]
        lasts = [None if b is None else b - (k << 32) for k, _, b in part.correlations]
        if None not in firsts:
            ids.append(f"correlationId > {min(firsts)}")
        if None not in lasts:
            ids.append(f"correlationId <= {max(lasts)}")
        ctx.gpu_where = f"({' AND '.join(ids)}) OR (start >= {lo} AND start < {hi})"
    elif part.steps is not None:  # the work the kept calls launched, wherever it ran
        ids = ctx.correlation_range(ctx.gpu_where)  # (the part's host condition: not the next part's events)
        inside = f"start >= {lo} AND start < {hi}"
        ctx.gpu_where = inside if ids is None else f"(correlationId BETWEEN {ids[0]} AND {ids[1]}) OR ({inside})"
    trace = _read_tables(path, ctx, events=events)
    return slice_trace(trace, part, origin_ns=origin, all_steps=all_steps)


def _read_tables(path: Path, ctx: _Ctx, *, events: int | None = None) -> Trace:
    """The whole export's tables, or (``events``: the whole export's event count) the part
    the context's conditions select."""
    from concurrent.futures import ThreadPoolExecutor

    ctx.plan_progress()
    ctx.prefetch_domains()
    gpu_tables = [ctx.kernels(), ctx.memcpy(), ctx.memset()]
    # the GPU tables merged beside the host tables' read (merge_by_start empties the list)
    with ThreadPoolExecutor(1, thread_name_prefix="proflab-merge") as pool:
        merged = pool.submit(merge_by_start, gpu_tables)
        cpu = merge_by_start([ctx.api("CUPTI_ACTIVITY_KIND_RUNTIME", "cuda_runtime"),
                              ctx.api("CUPTI_ACTIVITY_KIND_DRIVER", "cuda_driver"), ctx.nvtx(), ctx.osrt()])  # fmt: skip
        gpu = merged.result()
    gpu, cpu = ctx.decode(gpu), ctx.decode(cpu)
    ctx.release()
    gpu, cpu = _timed(gpu, "GPU", ctx.notes), _timed(cpu, "host", ctx.notes)
    if ctx.not_utf8:
        ctx.notes.append(f"{ctx.not_utf8} name(s) that were not UTF-8 (a damaged export) are shown with U+FFFD for each bad byte")
    if gpu.height == 0 and cpu.height == 0 and events is None:  # (an empty part: slicing says so)
        raise EmptyTrace(path, "Nsight Systems export with no CUDA, NVTX or OS runtime events")
    devices = ctx.devices()
    meta = TraceMeta(
        source=str(path),
        format="nsys-sqlite",
        format_version=ctx.schema_version(),
        size_bytes=path.stat().st_size,
        event_count=gpu.height + cpu.height if events is None else events,
        versions=ctx.versions(),
        notes=tuple(ctx.notes),
    )
    return Trace(gpu=gpu, cpu=cpu, steps=steps_from_annotations(cpu), devices=devices, meta=meta)


def _timed(df: pl.DataFrame, what: str, notes: list[str]) -> pl.DataFrame:
    """Only events with a start and an end at or after it: a damaged row (end before start,
    no start) is dropped, and the notes say how many were."""
    bad = pl.col("start_ns").is_null() | pl.col("dur_ns").is_null() | (pl.col("dur_ns") < 0)
    dropped = df.select(bad.sum()).item()
    if not dropped:
        return df
    notes.append(f"{dropped} {what} event(s) without a valid start or with an end before their start were dropped")
    return df.filter(~bad)


class _Ctx:
    def __init__(self, path: Path, con: sqlite3.Connection, bulk, tables: set[str], connect) -> None:
        self.path, self.con, self.bulk, self.tables = path, con, bulk, tables
        self._connect = connect  # opens another ADBC connection (for the reading threads)
        self._readers: list = []  # the reading threads' connections
        self.native: native.Connections | None = None  # the compiled column reader's, where it is built
        self._domains = None  # the NVTX domain scan's rows, or its future (``prefetch_domains``)
        self._domain_pool = None
        self._local = threading.local()
        self._pool = None  # the reading threads, started at the first large table
        self.notes: list[str] = []
        self._strings: pl.DataFrame | None = None
        self._comm_ids: pl.Series | None = None
        # names travel as UInt32 codes into these texts until the tables are merged
        self._texts: list[pl.Series] = []
        self._n_texts = 0
        self.not_utf8 = 0  # texts that were not UTF-8 (shown repaired)
        self._lookups: dict[str, pl.DataFrame] = {}
        # SQL conditions a part of the export (``_read_part``) puts on host and GPU tables
        self.host_where: str | None = None
        self.gpu_where: str | None = None
        # progress: rowids of the event tables to read in all, and read so far
        self._planned: dict[str, int] = {}
        self._rows_total = self._rows_done = 0

    def plan_progress(self) -> None:
        """Count the rowids of the event tables the read will go through, so each piece read
        can report the share of the export done."""
        self._planned = event_table_rows(self.con, self.tables)
        self._rows_total = sum(self._planned.values())

    def _advance(self, table: str, rows: int) -> None:
        if table in self._planned and self._rows_total:
            self._rows_done += rows
            progress.update(self._rows_done / self._rows_total)

    def where(self, kind: str, sql: str) -> str:
        """``sql`` with the part's condition for a ``"host"`` or ``"gpu"`` table added."""
        cond = self.gpu_where if kind == "gpu" else self.host_where
        if not cond:
            return sql
        return f"{sql} {'AND' if ' WHERE ' in sql else 'WHERE'} ({cond})"

    def step_ranges(self) -> str:
        """The SQL condition on NVTX rows that may be profiler steps (LIKE ignores case: a
        superset, named exactly once read). Their StringIds ids are listed, not selected in
        a subquery: ``fetch`` splits a query into pieces by the rowids of its one table."""
        rows = self.con.execute("SELECT id FROM StringIds WHERE value LIKE 'ProfilerStep#%'") if "StringIds" in self.tables else []
        ids = [str(i) for (i,) in rows if type(i) is int]  # (a damaged id is no step's)
        listed = f" OR textId IN ({', '.join(ids)})" if ids else ""
        return f"text LIKE 'ProfilerStep#%'{listed}"

    def extent(self) -> tuple[int, int | None]:
        """How many events a whole read keeps (the export's, when only a part is read) and the
        first one's start, one scan of each event table (``scan``): rows with a start and an
        end at or after it; of NVTX, the ranges."""
        queries = []
        for t in EVENT_TABLES:
            if t in self.tables and {"start", "end"} <= self.columns(t):
                nvtx = f" AND eventType IN {_NVTX_RANGES}" if t == "NVTX_EVENTS" else ""
                queries += [(t, f'SELECT count(*), min(start) FROM "{t}" WHERE end >= start{nvtx} AND {rows}') for rows in self.halves(t)]
        count, firsts = 0, []
        for (t, _), got in zip(queries, self.scan([q for _, q in queries]), strict=True):
            n, first = self._checked(t, "start", got[0])
            count += n
            if first is not None:
                firsts.append(first)
        return count, (min(firsts) if firsts else None)

    def halves(self, table: str) -> list[str]:
        """Conditions that split ``table`` by rowid into one range per reading thread, for
        ``scan``; one that takes every row where the table is small or has no rowids."""
        try:
            low, top = self.con.execute(rowid_bounds(table)).fetchone()
        except sqlite3.OperationalError:
            low = top = None
        if top is None or top - low < _CHUNK_ROWS:
            return ["1"]
        step = -(-(top - low + 1) // _READ_THREADS)
        return [f"rowid >= {lo} AND rowid < {lo + step}" for lo in range(low, top + 1, step)]

    def scan(self, queries: list[str]) -> list[list[tuple]]:
        """Each query's rows, the queries shared among ``_READ_THREADS`` threads, each with a
        connection of its own: SQLite steps through rows without the GIL, so a scan of every
        row of a table (the extent, the kernel comparison of a part read for the budget) runs
        on every core, not one (the 2104 MB export: 3.1 s of one core)."""
        if len(queries) < 2:
            return [self.con.execute(q).fetchall() for q in queries]
        from concurrent.futures import ThreadPoolExecutor

        def run(share: list[str]) -> list[list[tuple]]:
            con = sqlite3.connect(read_only_uri(self.path), uri=True)
            try:
                return [con.execute(q).fetchall() for q in share]
            finally:
                con.close()

        # every n-th query to each thread: a table's halves go to different threads
        shares = [queries[i::_READ_THREADS] for i in range(_READ_THREADS)]
        with ThreadPoolExecutor(_READ_THREADS, thread_name_prefix="proflab-scan") as pool:
            done = [f.result() for f in [pool.submit(run, share) for share in shares]]
        out: list[list[tuple]] = [[] for _ in queries]
        for i, got in enumerate(done):
            out[i::_READ_THREADS] = got
        return out

    def next_work(self, specs: list[SliceSpec]) -> list[tuple[NextWork, ...]]:
        """For each part but the last of a trace analysed in parts, per device, the next
        part's first GPU work and its launch (``TraceMeta.next_part_work``): one scan of each
        GPU table for every part's first work (by its correlation ids), then the launch calls
        of those few."""
        pid = "(globalPid / 16777216) % 16777216"
        conds = [_next_part_rows(spec) for spec in specs[1:]]
        if not conds or None in conds:
            return [() for _ in specs[1:]]
        which = "CASE " + " ".join(f"WHEN {c} THEN {i}" for i, c in enumerate(conds)) + " END"
        first: dict[tuple[int, int], tuple[int, int, int]] = {}  # (part, device) -> (start, pid, correlation id)
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            if t not in self.tables or not {"correlationId", "globalPid", "deviceId", "start"} <= set(self.columns(t)):
                continue
            queries = [f'SELECT i, deviceId, min(start), p, c FROM (SELECT {which} AS i, deviceId, start, {pid} AS p, correlationId AS c '
                       f'FROM "{t}" WHERE {part}) WHERE i IS NOT NULL GROUP BY i, deviceId' for part in self.halves(t)]
            for i, device, start, p, c in (row for rows in self.scan(queries) for row in rows):
                if all(type(v) is int for v in (i, device, start, p, c)) and ((i, device) not in first or start < first[(i, device)][0]):
                    first[(i, device)] = (start, p, c)
        calls: dict[tuple[int, int], tuple] = {}
        ids = ", ".join(sorted({str(c) for _, _, c in first.values()}))
        for t in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"):
            if ids and t in self.tables and {"correlationId", "globalTid", "start", "end", "nameId"} <= set(self.columns(t)):
                for p, c, a, b, tid, name in self.con.execute(
                    f'SELECT (globalTid / 16777216) % 16777216, correlationId, start, end, globalTid % 16777216, nameId FROM "{t}" '
                    f"WHERE correlationId IN ({ids})"
                ):
                    calls.setdefault((p, c), (a, b, tid, self.string_of(name) if type(name) is int else None))
        out: list[list[NextWork]] = [[] for _ in conds]
        for (i, device), (start, p, c) in sorted(first.items()):
            a, b, tid, name = calls.get((p, c), (None, None, None, None))
            out[i].append(NextWork(device, start, a if type(a) is int else None, b if type(b) is int else None,
                                   tid if type(tid) is int else None, name))
        return [tuple(w) for w in out]

    def latest_launches(self, times: list[int]) -> tuple[list[dict[int, int]], set[int]]:
        """Per cut time (ns), per process, the highest correlation id (the model's, ``pid <<
        32 | id``) of runtime and driver calls starting before it; and the processes with any
        (``readers.budget.by_launch``). One scan of each table, a rowid range per thread."""
        pid = "(globalTid / 16777216) % 16777216"
        cases = "".join(f", max(CASE WHEN start < {int(t)} THEN correlationId END)" for t in times)
        got: dict[int, list] = {}
        for t in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"):
            if t not in self.tables or not {"correlationId", "globalTid", "start"} <= set(self.columns(t)):
                continue
            for rows in self.scan([f'SELECT {pid}{cases} FROM "{t}" WHERE correlationId IS NOT NULL AND globalTid IS NOT NULL '
                                   f"AND {part} GROUP BY 1" for part in self.halves(t)]):
                for key, *maxima in rows:
                    if type(key) is not int:
                        continue
                    had = got.setdefault(key, [None] * len(times))
                    for i, v in enumerate(maxima):
                        if type(v) is int and (had[i] is None or v > had[i]):
                            had[i] = v
        latest = [{k: (k << 32) + m[i] for k, m in got.items() if m[i] is not None} for i in range(len(times))]
        return latest, set(got)

    def correlation_range(self, cond: str) -> tuple[int, int] | None:
        """Lowest and highest correlation id of runtime and driver calls meeting ``cond``."""
        lows, highs = [], []
        for t in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"):
            if t in self.tables and "correlationId" in self.columns(t):
                lo, hi = self._integers(t, "correlationId", f'SELECT min(correlationId), max(correlationId) FROM "{t}" WHERE {cond}')
                if lo is not None:
                    lows.append(lo)
                    highs.append(hi)
        return (min(lows), max(highs)) if lows else None

    def _integers(self, table: str, column: str, sql: str) -> tuple:
        """The row ``sql`` gives, checked by ``_checked``."""
        return self._checked(table, column, self.con.execute(sql).fetchone())

    def _checked(self, table: str, column: str, row: tuple) -> tuple:
        """``row``: integers or None, as a whole read would need them (SQLite keeps any type in
        any column: text or a REAL there is refused as it would be there)."""
        if any(v is not None and type(v) is not int for v in row):
            raise SchemaError(self.path, f"unexpected value types in table {table} column {column} (values out of range or not integers)")
        return row

    def close_readers(self) -> None:
        if self._domain_pool is not None:  # (a scan not waited for: the read failed before the NVTX table)
            self._domain_pool.shutdown(wait=True, cancel_futures=True)
            self._domain_pool = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for c in self._readers:
            try:
                c.close()
            except Exception:  # closing a connection of a failed read: nothing more to do
                pass
        self._readers = []
        if self.native is not None:
            self.native.close()

    def _reader(self):
        """This thread's own ADBC connection (one statement at a time per connection)."""
        c = getattr(self._local, "bulk", None)
        if c is None:
            c = self._local.bulk = self._connect()
            self._readers.append(c)
        return c

    def release(self) -> None:
        self._strings = self._comm_ids = None
        self._lookups = {}

    def columns(self, table: str) -> set[str]:
        return {r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")')}

    def need(self, table: str, *cols: str) -> None:
        missing = [c for c in cols if c not in self.columns(table)]
        if missing:
            raise SchemaError(self.path, f"table {table} lacks column(s) {', '.join(missing)} (unsupported export version?)")

    def fetch(self, sql: str, schema: dict[str, pl.DataType], finish=None, cut: tuple[bytes, ...] = (),
              coded: tuple[str, ...] = ()) -> pl.DataFrame:
        """The rows of ``sql`` (one table, no joins) as typed columns, read into Arrow without a
        Python object per value (``_fetch_arrow``), ``_CHUNK_ROWS`` rows of the table at a time
        (by rowid range), each chunk finished before the next is read: what reading costs
        beyond the finished columns is one chunk, whatever the table's size. The columns are
        named and typed by ``schema`` (in order); ``finish`` turns them into their final form.
        The driver infers each column's type from its first batch, so text columns are
        selected as ``coalesce(col, '')``. ``cut``: markers the compiled reader may cut text
        at, and ``coded``: text columns it may give as codes into their distinct texts
        (``_sqlite_native.Coded``, the piece ``finish`` is then given); ``finish`` must give
        the same frame whether it did either or not."""
        finish = finish or (lambda d: d)
        table = sql.split(" FROM ", 1)[1].split()[0]
        try:
            low, top = self.con.execute(rowid_bounds(table)).fetchone()
        except sqlite3.OperationalError:  # a table without rowids: one piece
            low = top = None
        if top is None or top - low < _CHUNK_ROWS or (top - low) // _CHUNK_ROWS > _MAX_PIECES:
            # (one piece, too, where the rowids are far from dense: a damaged or hand-set id
            # of -2**63 made 3.5e13 pieces, and the list of their queries filled 24 GB)
            done = finish(self._fetch_arrow(sql, schema, table, cut=cut, coded=coded))
            self._advance(table, self._planned.get(table, 0))
            return done
        glue = "AND" if " WHERE " in sql else "WHERE"
        # rowids can start at 0 (StringIds ids) or below
        pieces = [f"{sql} {glue} rowid > {lo} AND rowid <= {lo + _CHUNK_ROWS}" for lo in range(low - 1, top, _CHUNK_ROWS)]
        chunks = []
        for i, df in enumerate(self._fetch_pieces(pieces, schema, table, cut, coded)):
            if (df.frame if isinstance(df, native.Coded) else df).height or not chunks:
                chunks.append(finish(df))
            self._advance(table, min(_CHUNK_ROWS, top - (low - 1) - i * _CHUNK_ROWS))
        return pl.concat(chunks, rechunk=False) if len(chunks) > 1 else chunks[0]

    def _fetch_pieces(self, pieces: list[str], schema: dict[str, pl.DataType], table: str, cut: tuple[bytes, ...],
                      coded: tuple[str, ...]):
        """Each piece's rows, in order. SQLite decodes rows with the GIL released, so
        ``_READ_THREADS`` threads, each on a connection of its own, read the next pieces while
        this thread finishes the last one; at most that many raw pieces are held at a time."""
        if len(pieces) < 2:
            for q in pieces:
                yield self._fetch_arrow(q, schema, table, cut=cut, coded=coded)
            return
        if self._pool is None:  # one pool for the whole read: its threads keep their connections
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(_READ_THREADS, thread_name_prefix="proflab-nsys")
        pool = self._pool
        ahead = [pool.submit(self._fetch_arrow, q, schema, table, True, cut, coded) for q in pieces[:_READ_THREADS]]
        try:
            for i in range(len(pieces)):
                df = ahead.pop(0).result()
                if i + _READ_THREADS < len(pieces):
                    ahead.append(pool.submit(self._fetch_arrow, pieces[i + _READ_THREADS], schema, table, True, cut, coded))
                yield df
        finally:  # a failed piece or finish: pieces not yet begun are dropped (close_readers waits for the rest)
            for f in ahead:
                f.cancel()

    def _fetch_arrow(self, sql: str, schema: dict[str, pl.DataType], table: str, threaded: bool = False,
                     cut: tuple[bytes, ...] = (), coded: tuple[str, ...] = ()) -> pl.DataFrame | native.Coded:
        raw = None
        if self.native is not None:  # (a threaded read is of a piece: room for its rows at once)
            raw = self.native.frame(sql, schema, cut, _CHUNK_ROWS if threaded else 0, coded)
        # (the compiled reader takes only integers in integer columns and UTF-8 in text ones)
        if isinstance(raw, native.Coded):  # (its coded columns stay UInt32 codes)
            return native.Coded(self._typed(raw.frame, {**schema, **dict.fromkeys(raw.texts, pl.UInt32)}, table, checked=True), raw.texts)
        if raw is not None:
            return self._typed(raw, schema, table, checked=True)
        # (the compiled reader gave up on the piece, or is not built)
        return _detached(self._typed(self._fetch_adbc(sql, schema, table, threaded), schema, table))

    def _typed(self, raw: pl.DataFrame, schema: dict[str, pl.DataType], table: str, checked: bool = False) -> pl.DataFrame:
        """A piece's frame cast to ``schema``; a value of another type is refused naming its
        column. Text is checked before anything reads it: the ADBC driver hands SQLite's TEXT
        to Arrow as it is stored, and a text that is not UTF-8 in a frame stops the process
        wherever polars turns it into a message (an integer column's ``b"\x80" b"1438831"``
        made the cast's error abort with a panic). So text where integers belong is refused
        by its type alone, its values unread (the driver types a column by its first batch,
        which types an all-NULL one as integers: text there is text in the table), and text
        where text belongs is taken as bytes and checked (``_text_of``). ``checked``: the
        compiled reader's frame, whose text it checked as it read."""
        if raw.width == 0 or raw.height == 0:
            return pl.DataFrame(schema=schema)
        for c, t in schema.items():
            got = raw.schema[c]
            if t != pl.String and got in (pl.String, pl.Binary):
                raise SchemaError(self.path, f"unexpected value types in table {table} column {c} (text where integers belong)")
            if t == pl.String and got == pl.String and not checked:  # (bytes again: a reinterpretation, nothing read)
                raw = raw.with_columns(self._text_of(raw.get_column(c).cast(pl.Binary)))
            elif t == pl.String and got == pl.Binary:  # a BLOB where text belongs (a damaged export)
                raw = raw.with_columns(self._text_of(raw.get_column(c)))
        try:
            return raw.cast(schema)  # type: ignore[arg-type]
        except pl.exceptions.InvalidOperationError as e:  # a REAL or text where nsys writes integers
            col = next((c for c in schema if f"'{c}'" in str(e)), None)
            where = {None: "", "dur_ns": " columns start/end", "start_ns": " column start"}.get(col, f" column {col}")
            raise SchemaError(self.path, f"unexpected value types in table {table}{where} (values out of range or not integers)") from e

    def _fetch_adbc(self, sql: str, schema: dict[str, pl.DataType], table: str, threaded: bool) -> pl.DataFrame:
        """The rows of ``sql`` through the ADBC driver, named as ``schema``."""
        from adbc_driver_sqlite.dbapi import DatabaseError

        cur = (self._reader() if threaded else self.bulk).cursor()
        try:
            cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(_BATCH_ROWS)})
            cur.execute(sql)
            raw = pl.DataFrame(cur.fetch_arrow())
        except (DatabaseError, pl.exceptions.ComputeError) as e:  # errors met while streaming come via polars
            if "Type mismatch" in str(e):
                raise SchemaError(self.path, f"unexpected value types in table {table} ({_first_line(e)})") from e
            if isinstance(e, pl.exceptions.ComputeError) and "[SQLite]" in str(e):
                raise CorruptInput(self.path, f"damaged or truncated SQLite database ({_first_line(e)})") from e
            raise
        finally:
            cur.close()
        return raw if raw.width == 0 else raw.rename(dict(zip(raw.columns, schema, strict=True)))

    def _text_of(self, values: pl.Series) -> pl.Series:
        """Bytes as text; what is not UTF-8 shows U+FFFD for each bad byte, and is counted for
        the notes (kept as read, it would fail, or stop the process, wherever it is shown)."""
        try:
            return values.cast(pl.String)
        except pl.exceptions.PolarsError:
            raw = values.to_list()
            self.not_utf8 += sum(1 for b in raw if b is not None and not _is_utf8(b))
            return pl.Series(values.name, [None if b is None else b.decode("utf-8", "replace") for b in raw], dtype=pl.String)

    def strings(self) -> pl.DataFrame:
        if self._strings is None:
            self._strings = (
                # one text per id, even in a damaged export (a join must not add rows)
                self.fetch("SELECT id, value FROM StringIds", {"id": pl.Int64, "value": pl.String}).unique("id", keep="first")
                if "StringIds" in self.tables
                else pl.DataFrame(schema={"id": pl.Int64, "value": pl.String})
            )
        return self._strings

    def string_of(self, sid) -> str:
        """One StringIds text by its id (repaired where not UTF-8); '' for none."""
        if "StringIds" not in self.tables or type(sid) is not int:
            return ""
        row = self.con.execute("SELECT CAST(value AS BLOB) FROM StringIds WHERE id = ?", (sid,)).fetchone()
        return row[0].decode("utf-8", "replace") if row and isinstance(row[0], bytes) else ""

    def comm_ids(self) -> pl.Series:
        """StringIds ids of collective-communication kernel names."""
        if self._comm_ids is None:
            strings = self.strings()
            self._comm_ids = strings.filter(pl.col("value").str.contains(COMM_KERNEL_PATTERN))["id"]
        return self._comm_ids

    # -- names: codes into one dictionary until the tables are merged ----------------------
    def _add_texts(self, values: pl.Series) -> int:
        """Append distinct texts to the dictionary; returns the code of the first. Copied into
        buffers of their own, so the dictionary never keeps a whole chunk's text alive."""
        first = self._n_texts
        # (as bytes: a damaged export's text need not be UTF-8, and polars then says so)
        own = self._text_of(pl.Series("value", values.cast(pl.Binary).to_list(), dtype=pl.Binary))
        self._texts.append(own)
        self._n_texts += values.len()
        return first

    def codes(self, ids: pl.Series, kind: str = "raw", clean: Clean | None = None) -> pl.Series:
        """Dictionary codes (UInt32) for StringIds ids; null where the id has no string.
        ``clean`` (texts to texts) rewrites each string once, when its id is
        first met, never per row. Ids are looked up as integers: no text is built per row."""
        known = self._lookups.get(kind)
        new = ids.drop_nulls().unique()
        if known is not None:
            new = new.filter(~new.is_in(known["id"].implode()))
        if new.len():
            found = self.strings().join(new.rename("id").to_frame(), on="id", how="semi")
            if clean is not None:
                found = found.with_columns(clean(found.get_column("value")).alias("value"))
            first = self._add_texts(found["value"])
            add = found.select("id", pl.int_range(first, first + found.height, dtype=pl.UInt32).alias("code"))
            known = add if known is None else pl.concat([known, add])
            self._lookups[kind] = known
        if known is None:
            return pl.repeat(None, ids.len(), dtype=pl.UInt32, eager=True)
        return ids.replace_strict(known["id"], known["code"], default=None, return_dtype=pl.UInt32)

    def text_codes(self, text: pl.Series, clean: Clean | None = None) -> pl.Series:
        """Dictionary codes for text given per row: each distinct value enters the
        dictionary once per chunk, rows keep a code. ``clean`` (texts to texts)
        rewrites each distinct text once (each row's, where a chunk's texts are mostly
        unique); a text it leaves empty gets no code (null)."""
        if text.null_count() == text.len():
            return pl.repeat(None, text.len(), dtype=pl.UInt32, eager=True)
        # emit_nvtx's texts are unique per row (a running op id) and their cleaned names few:
        # then each row is cleaned and the names coded, 3x faster than a dictionary of every
        # text (524 k texts: 0.08 s against 0.26 s); repeated texts are cleaned once each.
        # Which it is, the chunk's first rows tell (its whole distinct set cost 0.07 s).
        head = text.head(_SAMPLE_ROWS).drop_nulls()
        per_row = clean is not None and 2 * head.n_unique() > head.len()
        distinct = None if per_row else text.drop_nulls().unique(maintain_order=True).rename("value")
        source = text.rename("value") if per_row else distinct
        cleaned = source if clean is None else clean(source).rename("value")
        code = self._entered(cleaned)
        return code if per_row else text.replace_strict(distinct, code, default=None, return_dtype=pl.UInt32)

    def distinct_codes(self, codes: pl.Series, distinct: pl.Series, clean: Clean | None = None) -> pl.Series:
        """``text_codes`` of text read as codes into its distinct texts (``native.Coded``): each
        distinct text cleaned and entered once, then one gather of integers for the rows."""
        if distinct.len() == 0 or distinct.null_count() == distinct.len():
            return pl.repeat(None, codes.len(), dtype=pl.UInt32, eager=True)
        cleaned = distinct.rename("value") if clean is None else clean(distinct.rename("value")).rename("value")
        return self._entered(cleaned).gather(codes)

    def _entered(self, cleaned: pl.Series) -> pl.Series:
        """A dictionary code for each of these texts (named "value"): each distinct text
        enters the dictionary once, in the order first met; empty text gets none (null)."""
        names = cleaned.filter(cleaned != "").unique(maintain_order=True)
        first = self._add_texts(names)
        lookup = names.to_frame().with_columns(pl.int_range(first, first + names.len(), dtype=pl.UInt32).alias("code"))
        return cleaned.to_frame().join(lookup, on="value", how="left", maintain_order="left")["code"]

    def decode(self, df: pl.DataFrame) -> pl.DataFrame:
        """The merged frame's name codes replaced by their text: one gather from the small
        dictionary, so each row holds a 16-byte view into it, never a copy of the text."""
        if df.schema["name"] == pl.String:  # nothing was read (the empty schema)
            return df
        texts = pl.concat(self._texts, rechunk=True) if self._texts else pl.Series(dtype=pl.String)
        return df.with_columns(texts.gather(df.get_column("name")).alias("name"))

    # -- GPU ---------------------------------------------------------------------------
    def _gpu_frame(self, df: pl.DataFrame, kind: str) -> pl.DataFrame:
        pid = (pl.col("global_pid") // (1 << 24)) % (1 << 24)
        df = df.with_columns(
            pl.lit(kind).cast(GPU_SCHEMA["kind"]).alias("kind"),
            ((pid * (1 << 32)) + pl.col("correlation")).alias("correlation"),
            pl.lit(None, dtype=pl.Int64).alias("external_id"),
        )
        for col, dtype in _CODED_GPU.items():
            if col not in df.columns:
                df = df.with_columns(pl.lit(None, dtype=dtype).alias(col))
        return counts_only(df.select([pl.col(c).cast(t) for c, t in _CODED_GPU.items()]))

    def kernels(self) -> pl.DataFrame:
        t = "CUPTI_ACTIVITY_KIND_KERNEL"
        if t not in self.tables:
            return pl.DataFrame(schema=GPU_SCHEMA)
        self.need(t, "start", "end", "deviceId", "streamId", "correlationId", "globalPid", "demangledName")
        cols = self.columns(t)
        shared = " + ".join(c for c in ("staticSharedMemory", "dynamicSharedMemory") if c in cols) or "NULL"
        dims = ", ".join(f"k.{c}" if c in cols else "NULL" for c in ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"))
        regs = "k.registersPerThread" if "registersPerThread" in cols else "NULL"
        df = self.fetch(
            self.where("gpu", f"SELECT k.demangledName, k.deviceId, k.streamId, k.start, k.end - k.start, "
                       f"k.correlationId, k.globalPid, {dims}, {regs}, {shared} FROM {t} k"),
            {"name_id": pl.Int64, "device": pl.Int32, "stream": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64,
             "correlation": pl.Int64, "global_pid": pl.Int64, "grid_x": pl.Int32, "grid_y": pl.Int32, "grid_z": pl.Int32,
             "block_x": pl.Int32, "block_y": pl.Int32, "block_z": pl.Int32, "registers": pl.Int32,
             "shared_mem_bytes": pl.Int64},
            lambda df: self._gpu_frame(
                # by id: the pattern runs over each distinct name once, not over every kernel's
                df.with_columns(
                    pl.col("name_id").is_in(self.comm_ids().implode()).alias("is_comm"),
                    self.codes(df["name_id"]).alias("name"),
                ),
                "kernel",
            ),
        )  # fmt: skip
        return df

    def memcpy(self) -> pl.DataFrame:
        t = "CUPTI_ACTIVITY_KIND_MEMCPY"
        if t not in self.tables:
            return pl.DataFrame(schema=GPU_SCHEMA)
        self.need(t, "start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes", "copyKind", "srcKind", "dstKind")
        df = self.fetch(
            self.where("gpu", f"SELECT deviceId, streamId, start, end - start, correlationId, globalPid, bytes, copyKind, srcKind, dstKind FROM {t}"),
            {"device": pl.Int32, "stream": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64, "correlation": pl.Int64,
             "global_pid": pl.Int64, "bytes": pl.Int64, "ck": pl.Int64, "sk": pl.Int64, "dk": pl.Int64},
            lambda df: self._gpu_frame(
                df.with_columns(
                    _mapped("ck", _COPY_KIND, COPY_KINDS).alias("copy_kind"),
                    _mapped("sk", _MEM_KIND, MEMORY_KINDS).alias("src_kind"),
                    _mapped("dk", _MEM_KIND, MEMORY_KINDS).alias("dst_kind"),
                    pl.lit(False).alias("is_comm"),
                ).pipe(
                    # the same names Kineto gives copies, so reports read alike whatever the input
                    self._coded_names, ["copy_kind", "src_kind", "dst_kind"],
                    pl.format("Memcpy {} ({} -> {})", "copy_kind", "src_kind", "dst_kind"),
                ),
                "memcpy",
            ),
        )  # fmt: skip
        return df

    def memset(self) -> pl.DataFrame:
        t = "CUPTI_ACTIVITY_KIND_MEMSET"
        if t not in self.tables:
            return pl.DataFrame(schema=GPU_SCHEMA)
        self.need(t, "start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes")
        kind = "memKind" if "memKind" in self.columns(t) else "NULL"
        df = self.fetch(
            self.where("gpu", f"SELECT deviceId, streamId, start, end - start, correlationId, globalPid, bytes, {kind} FROM {t}"),
            {"device": pl.Int32, "stream": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64, "correlation": pl.Int64,
             "global_pid": pl.Int64, "bytes": pl.Int64, "mk": pl.Int64},
            lambda df: self._gpu_frame(
                df.with_columns(pl.lit(False).alias("is_comm")).pipe(
                    self._coded_names, ["mk"],
                    pl.format("Memset ({})", _mapped("mk", _MEM_KIND, MEMORY_KINDS).cast(pl.String).fill_null("unknown")),
                ),
                "memset",
            ),
        )  # fmt: skip
        return df

    # -- host ----------------------------------------------------------------------------
    def _host_frame(self, df: pl.DataFrame, cat: str, *, correlated: bool) -> pl.DataFrame:
        pid = (pl.col("global_tid") // (1 << 24)) % (1 << 24)
        df = df.with_columns(
            pl.lit(cat).cast(CPU_SCHEMA["cat"]).alias("cat"),
            pid.alias("pid"),
            (pl.col("global_tid") % (1 << 24)).alias("tid"),
            ((pid * (1 << 32)) + pl.col("correlation")).alias("correlation") if correlated
            else pl.lit(None, dtype=pl.Int64).alias("correlation"),
        )  # fmt: skip
        for col, dtype in _CODED_CPU.items():
            if col not in df.columns:
                df = df.with_columns(pl.lit(None, dtype=dtype).alias(col))
        return df.select([pl.col(c).cast(t) for c, t in _CODED_CPU.items()])

    def api(self, table: str, cat: str) -> pl.DataFrame:
        if table not in self.tables:
            return pl.DataFrame(schema=CPU_SCHEMA)
        self.need(table, "start", "end", "globalTid", "correlationId", "nameId")
        df = self.fetch(
            self.where("host", f"SELECT r.nameId, r.globalTid, r.start, r.end - r.start, r.correlationId FROM {table} r"),
            {"name_id": pl.Int64, "global_tid": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64, "correlation": pl.Int64},
            lambda df: self._host_frame(
                df.with_columns(self.codes(df["name_id"], "api", _unversioned).alias("name")),
                cat,
                correlated=True,
            ),
        )
        return df

    def nvtx(self) -> pl.DataFrame:
        t = "NVTX_EVENTS"
        if t not in self.tables:
            return pl.DataFrame(schema=CPU_SCHEMA)
        self.need(t, "start", "end", "eventType", "text", "textId", "globalTid")
        domains = self.named_domains()
        # a range's domain matters only where a domain was named: else it is not read (a column
        # of 8.6 M rows, read or a constant NULL, costs the 1048 MB export ~0.45 CPU s)
        domain = {"domain_id": pl.Int64} if domains else {}
        df = self.fetch(
            self.where("host", f"SELECT coalesce(n.text, ''), n.textId, {'n.domainId, ' if domains else ''}"
                       f"n.globalTid, n.start, n.end - n.start FROM {t} n WHERE n.end IS NOT NULL AND n.eventType IN {_NVTX_RANGES}"),
            {"name": pl.String, "name_id": pl.Int64, **domain, "global_tid": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64},
            lambda piece: self._host_frame(self._nvtx_names(self._range_names(piece), domains), "user_annotation", correlated=False),
            cut=_EMIT_NVTX_CUTS,  # (the same cut as _operator_only's, made while the text is read)
            coded=("name",),
        )
        return df

    def _domain_queries(self) -> list[str] | None:
        t = "NVTX_EVENTS"
        if t not in self.tables or not {"domainId", "eventType", "text"} <= self.columns(t):
            return None
        return [f"SELECT domainId, text FROM {t} WHERE eventType = 75 AND {r}" for r in self.halves(t)]

    def prefetch_domains(self) -> None:
        """Start the scan for the NVTX domains' names (``named_domains``) in a thread of its
        own, so that it runs while the tables before the NVTX table are read and merged, not
        after them (a whole scan of that table: 0.3 s of the 1048 MB export's read). Only
        where the scan is split among the reading threads, each on a connection of its own
        (``scan``): the reader's own connection serves only the thread that opened it."""
        queries = self._domain_queries()
        if self._domains is None and queries is not None and len(queries) >= 2:
            from concurrent.futures import ThreadPoolExecutor

            self._domain_pool = ThreadPoolExecutor(1, thread_name_prefix="proflab-domains")
            self._domains = self._domain_pool.submit(self.scan, queries)

    def named_domains(self) -> dict[int, str | None]:
        """The export's named NVTX domains (``eventType`` 75 rows: id -> name), in rowid order;
        empty where the table has no domain column."""
        if self._domains is None:
            queries = self._domain_queries()
            self._domains = self.scan(queries) if queries is not None else []
        found = self._domains if isinstance(self._domains, list) else self._domains.result()
        domains = {}
        for rows in found:
            # (a damaged export's id that is not an integer names no range's domain)
            domains.update((k, v) for k, v in rows if type(k) is int and (v is None or isinstance(v, str)))
        return domains

    def _range_names(self, piece: pl.DataFrame | native.Coded) -> pl.DataFrame:
        """A piece of NVTX ranges with their names as dictionary codes: text stored in the row
        wins over its textId; empty text is none."""
        if isinstance(piece, native.Coded):
            df = piece.frame
            inline = self.distinct_codes(df.get_column("name"), piece.texts["name"].replace("", None), _operator_only)
        else:
            df = piece
            inline = self.text_codes(df.get_column("name").replace("", None), _operator_only)
        return df.with_columns(inline.fill_null(self.codes(df.get_column("name_id"), "nvtx", _operator_only)).alias("name"))

    def _coded_names(self, df: pl.DataFrame, keys: list[str], text: pl.Expr) -> pl.DataFrame:
        """``name`` as a code: ``text`` (an expression over ``keys``) is formatted once per
        distinct combination of the keys, not once per row."""
        combos = df.select(keys).unique(maintain_order=True)
        first = self._add_texts(combos.select(text)[:, 0])
        combos = combos.with_columns(pl.int_range(first, first + combos.height, dtype=pl.UInt32).alias("name"))
        return df.join(combos, on=keys, how="left", nulls_equal=True, maintain_order="left")

    def _nvtx_names(self, df: pl.DataFrame, domains: dict[int, str]) -> pl.DataFrame:
        """Ranges of a named domain read "domain:range", as Nsight Systems shows them; a range
        without a name reads "". Built once per distinct (domain, name), not per row."""
        if not domains and not df.get_column("name").null_count():
            return df  # no named domain, and every range has a name: nothing to rename
        if "domain_id" not in df.columns:  # (not read: no domain was named)
            df = df.with_columns(pl.lit(None, dtype=pl.Int64).alias("domain_id"))
        texts = None
        if domains:  # (not rechunked: a chunk gathers a few names, never a copy of the dictionary)
            texts = pl.concat(self._texts, rechunk=False) if self._texts else pl.Series(dtype=pl.String)
        combos = df.select("domain_id", "name").unique(maintain_order=True)
        named = combos.with_columns(
            (texts.gather(combos["name"]) if texts is not None else pl.repeat(None, combos.height, dtype=pl.String, eager=True))
            .alias("text"),
            pl.col("domain_id").replace_strict(domains, default=None, return_dtype=pl.String).alias("domain")
            if domains else pl.lit(None, dtype=pl.String).alias("domain"),
        )  # fmt: skip
        renamed = named.filter(pl.col("domain").is_not_null() | pl.col("name").is_null())
        if renamed.height == 0:
            return df
        full = renamed.select(
            pl.when(pl.col("domain").is_not_null())
            .then(pl.concat_str([pl.col("domain"), pl.lit(":"), pl.col("text").fill_null("")]))
            .otherwise(pl.lit(""))
        )[:, 0]
        first = self._add_texts(full)
        renamed = renamed.select("domain_id", "name", pl.int_range(first, first + renamed.height, dtype=pl.UInt32).alias("_new"))
        return (
            df.join(renamed, on=["domain_id", "name"], how="left", nulls_equal=True, maintain_order="left")
            .with_columns(pl.col("_new").fill_null(pl.col("name")).alias("name"))
            .drop("_new")
        )

    def osrt(self) -> pl.DataFrame:
        t = "OSRT_API"
        if t not in self.tables:
            return pl.DataFrame(schema=CPU_SCHEMA)
        self.need(t, "start", "end", "globalTid", "nameId")
        df = self.fetch(
            self.where("host", f"SELECT o.nameId, o.globalTid, o.start, o.end - o.start FROM {t} o"),
            {"name_id": pl.Int64, "global_tid": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64},
            lambda df: self._host_frame(df.with_columns(self.codes(df["name_id"]).alias("name")), "os_runtime", correlated=False),
        )
        return df

    # -- context ------------------------------------------------------------------------
    def devices(self) -> pl.DataFrame:
        t = "TARGET_INFO_GPU"
        if t not in self.tables:
            self.notes.append("the export has no TARGET_INFO_GPU table: device names and properties are unknown")
            return pl.DataFrame(schema=DEVICE_SCHEMA)
        cols = self.columns(t)

        def col(name: str, expr: str | None = None) -> str:
            return (expr or name) if name in cols else "NULL"

        df = self.fetch(
            f"SELECT {col('cuDevice')}, {col('name')}, {col('smCount')}, {col('computeMajor')}, {col('computeMinor')}, "
            f"{col('totalMemory')}, {col('maxWarpsPerSm', 'maxWarpsPerSm * 32')}, {col('maxRegistersPerSm')}, "
            f"{col('maxShmemPerSm')} FROM {t}",
            DEVICE_SCHEMA,
        )
        return df

    def schema_version(self) -> str | None:
        if "META_DATA_EXPORT" not in self.tables:
            return None
        row = self.con.execute("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_SCHEMA_VERSION'").fetchone()
        return None if row is None else str(row[0])

    def versions(self) -> dict[str, str]:
        out = {}
        if "META_DATA_EXPORT" in self.tables:
            for name, value in self.con.execute(
                "SELECT name, value FROM META_DATA_EXPORT WHERE name IN ('EXPORT_SCHEMA_VERSION', 'EXPORT_PRODUCT_VERSION')"
            ):
                out["nsys_export_schema" if name == "EXPORT_SCHEMA_VERSION" else "nsys"] = str(value)
        return out


_EMIT_NVTX_KEYS = ("seq", "op_id", "sizes", "input_op_ids")
_EMIT_NVTX_KEY = rf", (?:{'|'.join(_EMIT_NVTX_KEYS)}) = "
_EMIT_NVTX_CUTS = tuple(f", {k} = ".encode() for k in _EMIT_NVTX_KEYS)


def _detached(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with its integer columns copied when it holds text. The driver's Arrow batch is
    freed as a whole, and polars takes integer columns over without a copy: kept in the
    finished chunk, they would keep the batch's text alive until the tables are merged. On a
    1014 MB export of emit_nvtx ranges (8.6 M texts) that held ~350 MiB more at the read's
    peak (1,624 -> 1,155 MiB). (The compiled reader's columns each own their memory.)"""
    if not any(t == pl.String for t in df.schema.values()):
        return df
    return df.with_columns(pl.col(c) + 0 for c, t in df.schema.items() if t.is_integer())


def _operator_only(names: pl.Series) -> pl.Series:
    """torch.autograd.profiler.emit_nvtx names ranges "aten::addmm, seq = 47595, op_id = 999269,
    sizes = [...]": the operator is the name; the rest would make every range unique. Applied
    to each distinct text once (StringIds), or to each row of inline text (``text_codes``).
    The key is found (``str.find``) and the text before it kept, 35 ms for 524 k texts where
    replacing the key and the rest by a pattern took 50. ``str.find`` counts bytes in polars
    up to 2.1 and characters from 2.2 ("é, seq = 4": 2, then 1): the cut takes the offset in
    the unit this polars counts (``_find_counts_bytes``), bytes kept by ``bin.head`` or
    characters by ``str.head``. Text of a damaged export that is not UTF-8 cannot be cut as
    bytes and be text again: there, the pattern (which keeps such text as it was read, for the
    reader's checks)."""
    v = pl.col("value")
    at = v.str.find(_EMIT_NVTX_KEY)
    # (cut before the key's ", ": a character boundary, so the bytes kept are text)
    head = v.cast(pl.Binary).bin.head(at).cast(pl.String) if _find_counts_bytes() else v.str.head(at)
    fast = pl.when(at.is_null()).then(v).otherwise(head)
    frame = names.rename("value").to_frame()
    try:
        return frame.select(fast).to_series()
    except pl.exceptions.ComputeError:
        return frame.select(v.str.replace(_EMIT_NVTX_KEY + ".*$", "")).to_series()


@functools.cache
def _find_counts_bytes() -> bool:
    """Whether this polars' ``str.find`` gives byte offsets (up to 2.1) or characters (2.2 on)."""
    return pl.select(pl.lit("é,").str.find(",")).item() == 2


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _unversioned(names: pl.Series) -> pl.Series:
    """Runtime and driver API names without their version suffix: ``cudaMemcpyAsync_v3020``."""
    return names.str.replace(r"(?:_v\d+)+$", "")


# texts to texts: how a name is cleaned once read
Clean = Callable[[pl.Series], pl.Series]


# rows of a chunk whose distinct share picks how its inline texts are coded (``text_codes``)
_SAMPLE_ROWS = 4096

# the model's schemas while reading: names are dictionary codes until the merge
_CODED_GPU = {**GPU_SCHEMA, "name": pl.UInt32}
_CODED_CPU = {**CPU_SCHEMA, "name": pl.UInt32}


def _mapped(col: str, mapping: dict[int, str], values: list[str]) -> pl.Expr:
    return pl.col(col).replace_strict(mapping, default="unknown", return_dtype=pl.String).cast(pl.Enum(values))
