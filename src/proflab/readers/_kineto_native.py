"""Tables of one slice of Kineto events from the compiled decoder (``_kscan``), the same as
the typed msgspec decode gives (``kineto._tables``), without a Python object per event.

``_kscan.scan`` turns the slice into a table of columns for each kind of event (GPU
activity, operators, Python frames, the rest's categories) and a list of its distinct
strings; numpy views each column where the parse wrote it, and the reader's own table
builders (``_kineto_tables.gpu_columns`` ...) take them in one polars query per table. A slice the
decoder gives up on (any value the typed decode would not take as is, or malformed JSON),
or one whose kernels must be linked to their launches by flow events, returns None, and the
caller decodes it the usual way: what is odd is always handled by the one path that has
handled it all along. ``PROFLAB_PURE_PYTHON=1`` turns this path off.
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
from collections import Counter
from collections.abc import Callable

import msgspec
import numpy as np
import polars as pl

from proflab.readers import _kineto_tables as _k
from proflab.readers._kineto_tables import ns_of

# Imported by name: a compiled module has no Python source, and the import graph the layer
# contract reads (.py files only) would take ``from proflab.readers import _kscan`` for an
# import of the package ``proflab.readers`` itself, a cycle that is not there.
try:
    _kscan = importlib.import_module("proflab.readers._kscan")
except ImportError:  # built without a C compiler: the msgspec decode does it all
    _kscan = None

__all__ = ["available", "tables", "scan"]

# mirror the record of _kscan.c: its words, each a column of the tables that keep it
_INTS = (
    "external_id", "external_id_old", "correlation", "device", "stream", "bytes", "registers",
    "shared_memory", "python_id", "python_parent_id", "sequence", "in_nelems", "out_nelems",
    "group_size", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
)  # fmt: skip
_SPANS = ("input_types", "input_dims", "collective", "dtype", "pg_name", "input_concrete")
_SLOT = {name: i for i, name in enumerate(_INTS)}
WORDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", *_INTS, *(f"off:{s}" for s in _SPANS), *(f"len:{s}" for s in _SPANS), "valid")
_VIEW = {"ts": np.float64, "dur": np.float64, "valid": np.uint64}  # (the rest: int64)
_TEXT = {"pid": 62, "tid": 63}  # bits of "valid": the value is a string's index
# A slice's tables are built by polars' in-memory engine: its queries are small, and the
# streaming engine (polars 2's default) cost more a query and gave each table in chunks of a
# few thousand rows, which a frame's select or drop later copied. The 514 MB trace: 2.06-2.16
# -> 1.90-1.97 s (medians of five and six, interleaved), the same report.
_ENGINE = "in-memory"
_OP, _GPU, _FRAME = 1, 2, 3
_VERSION = 5  # KSCAN_VERSION of the C source this module reads

if _kscan is not None and _kscan.layout()[:5] != (_VERSION, 8 * len(WORDS), len(_INTS), len(_SPANS), (_GPU, _OP, _FRAME, 0)):
    _kscan = None  # a build of another version of the source (an install not rebuilt): not used
# the record's words each kind's table keeps, in column order (by kind: other, op, gpu, frame)
_FIELDS = tuple(tuple(WORDS[w] for w in words) for words in _kscan.layout()[5]) if _kscan is not None else ()


def available() -> bool:
    """Whether the compiled decoder is built (from this version of its source) and not turned off."""
    return _kscan is not None and os.environ.get("PROFLAB_PURE_PYTHON", "") in ("", "0")


@functools.cache
def _categories() -> tuple[tuple[bytes, int], ...]:
    """The categories of a kind, for the decoder: (category's UTF-8, kind)."""
    return tuple((c.encode(), _kind(c)) for c in sorted(_k._OP_CATS | _k._GPU_CATS.keys() | {"python_function"}))


def scan(payload) -> tuple[int, dict[int, dict[str, np.ndarray]], list[str]] | str:
    """The slice's events, its tables by kind (``_GPU``, ``_OP``, ``_FRAME``, 0 for the rest's
    categories: each a column per record word it keeps) and its strings, or the decoder's
    reason for giving up."""
    try:
        got = _kscan.scan(payload, _categories())
    except MemoryError:  # (no room for its tables: the usual path decodes the slice)
        return "out of memory"
    if isinstance(got, str):
        return got
    count, tables, strings = got
    return count, {kind: _columns(kind, t) for kind, t in zip((_GPU, _OP, _FRAME, 0), tables)}, strings


def _columns(kind: int, table) -> dict[str, np.ndarray]:
    """A table's columns, viewed where the parse wrote them (a read-only buffer of ``cap`` rows
    of ``width`` words, the first ``n`` filled): each a strided view, no copy."""
    n, cap, width = table.shape()
    words = np.frombuffer(table, np.int64).reshape(cap, width)[:n]
    return {name: words[:, j].view(_VIEW.get(name, np.int64)) for j, name in enumerate(_FIELDS[kind])}


class _Rows:
    """A slice's rows of one kind (or those of them at ``index``), column by column. What
    polars takes is copied out of the decoder's buffer (``column(copy=True)``): polars takes
    numpy's memory as it is, and a column passed through as read would hold the whole table."""

    def __init__(self, columns: dict[str, np.ndarray], strings: list[str], text: pl.Series, index: np.ndarray | None = None) -> None:
        self.columns, self.index, self.strings, self.text = columns, index, strings, text
        self.size = len(columns["name"]) if index is None else index.size
        self.valid = self.column("valid")

    def at(self, index: np.ndarray) -> _Rows:
        """These rows at ``index`` only."""
        return _Rows(self.columns, self.strings, self.text, index if self.index is None else self.index[index])

    def column(self, name: str, copy: bool = False) -> np.ndarray:
        values = self.columns[name]
        if self.index is not None:
            return values[self.index]
        return values.copy() if copy else values

    def has(self, bit: int) -> np.ndarray:
        return (self.valid >> np.uint64(bit)) & np.uint64(1) == 1

    def numbers(self, ints: dict[str, pl.DataType], **more: pl.DataType) -> pl.DataFrame:
        """The start and duration in ns, the integer args ``ints`` (null where the event did
        not carry one) and the columns ``more`` (``pid`` or ``tid``) as ``dtype``: one polars
        select over the records' columns, not one call per column."""
        return self.numbers_lazy(ints, {}, **more).collect(engine=_ENGINE)

    def numbers_lazy(self, ints: dict[str, pl.DataType], keep: dict[str, pl.Series], **more: pl.DataType) -> pl.LazyFrame:
        """``numbers`` and the columns ``keep`` as they are, not yet computed: a table's
        columns from them in the same query (one polars call for the table)."""
        raw = {"ts": self.column("ts", copy=True), "dur": self.column("dur", copy=True)}
        for name in ints:
            raw[name], raw[f"{name}?"] = self.column(name, copy=True), self.has(_SLOT[name])
        exprs = [*_number_exprs(tuple(ints.items())), *map(pl.col, keep)]
        for name, dtype in more.items():
            if self.has(_TEXT[name]).any() or (dtype == pl.Int32 and not self._fits_i32(name)):
                exprs.append(pl.lit(self._ids_as_text(name, dtype)).alias(name))
            else:
                raw[name] = self.column(name, copy=True)
                exprs.append(pl.col(name).cast(dtype))
        return pl.DataFrame({**raw, **keep}).lazy().select(exprs)

    def _fits_i32(self, name: str) -> bool:
        values = self.column(name)
        return not values.size or (-(2**31) <= values.min() and values.max() < 2**31)

    def _ids_as_text(self, name: str, dtype: pl.DataType) -> pl.Series:
        """pid or tid where any is a string ("Spans") or past the column's type: read as the
        usual path reads them (the digits of each)."""
        values, text = self.column(name).tolist(), self.has(_TEXT[name]).tolist()
        return _k._ints([self.strings[v] if t else v for v, t in zip(values, text)], dtype)

    def strs(self, name: str) -> pl.Series:
        return self.text.gather(self.column(name))

    def coded(self, name: str, codes: pl.Series) -> pl.Series:
        """A string column through ``codes`` (a value per distinct string)."""
        return codes.gather(self.column(name))

    def raw(self, payload, name: str) -> Callable[[int], memoryview | None]:
        """Row i's raw JSON value of an arg (a collective's name, dtype, group), None where
        absent. (Not the input shapes: their text is interned, ``_shape_column``.)"""
        view = memoryview(payload)
        off, n = self.column(f"off:{name}"), self.column(f"len:{name}")

        def raw(i: int) -> memoryview | None:
            return view[off[i] : off[i] + n[i]] if n[i] >= 0 else None

        return raw


@functools.cache
def _number_exprs(ints: tuple[tuple[str, pl.DataType], ...]) -> tuple[pl.Expr, ...]:
    """``_Rows.numbers``' expressions for the start, the duration and the integer args
    ``ints``, built once for each set of args (a slice makes a few dozen polars calls, whose
    Python side is most of what a slice's tables cost beyond the parse)."""
    return (
        ns_of(pl.col("ts").fill_nan(None)).alias("start_ns"),  # a null or absent ts is NaN in the records
        ns_of(pl.col("dur")).clip(lower_bound=0).alias("dur_ns"),
        *(pl.when(pl.col(f"{name}?")).then(pl.col(name)).cast(dtype).alias(name) for name, dtype in ints),
    )


# ``External id``, or where absent ``external id`` as PyTorch 1.8-1.9 spelled it (as
# ``_kineto_tables._external_ids``: filling with an all-null column changes nothing)
_EXTERNAL_ID = pl.col("external_id").fill_null(pl.col("external_id_old"))


def tables(payload) -> _k._Tables | None:
    """The slice's tables, or None where the usual decode must do it: where the decoder gives
    up, and where anything fails after it (the slice is then decoded the usual way, which
    names a broken document's problem precisely)."""
    try:
        return _tables_of(payload)
    except Exception:
        return None


def _tables_of(payload) -> _k._Tables | None:
    got = scan(payload)
    if isinstance(got, str):
        return None
    count, kinds, strings = got
    text = pl.Series(strings, dtype=pl.String)
    counts = _first_seen_counts(kinds[0]["cat"], strings)
    unknown = Counter({c: n for c, n in counts.items() if c not in _k._KNOWN_CATS})
    gpu = _gpu_table(_Rows(kinds[_GPU], strings, text))
    if gpu.height and gpu.get_column("correlation").null_count() and counts.keys() & _k._FLOW_CATS:
        return None  # launches linked by flow events: the usual path does that
    ops, frames = _Rows(kinds[_OP], strings, text), _Rows(kinds[_FRAME], strings, text)
    cpu_ops = _cpu_table(ops)
    cpu = pl.concat([cpu_ops, _frame_table(frames)]) if frames.size else cpu_ops
    comms = _comm_table(ops, cpu_ops, payload)
    problems: Counter = Counter()  # (events without a start, or ending past the clock's range)
    gpu, cpu, comms = _k._timed(gpu, problems), _k._timed(cpu, problems), _k._timed(comms, None)
    return _k._Tables(gpu, cpu, unknown, count, problems, comms)


def _kind(cat: str) -> int:
    if cat in _k._OP_CATS:
        return _OP
    if cat in _k._GPU_CATS:
        return _GPU
    return _FRAME if cat == "python_function" else 0


def _first_seen_counts(cats: np.ndarray, strings: list[str]) -> Counter:
    """The categories and their counts, in the order they first occur (as ``Counter(list)``)."""
    counts: Counter = Counter()
    if cats.size:
        values, first, n = np.unique(cats, return_index=True, return_counts=True)
        for i in np.argsort(first, kind="stable"):
            counts[strings[values[i]]] += int(n[i])
    return counts


class _NameMemo:
    """What a name tells (``compute``: ``_kineto_tables.name_facts`` of GPU activity, ``_kineto_tables.shape_ops``
    of operators), worked out once per distinct name for all the slices read, not once per
    slice: a slice's GPU activity and operators mostly repeat names seen before, and polars'
    fixed cost a call (its patterns compiled) was most of what a slice paid (the 514 MB trace's
    31 slices: 69 -> 11 ms for the facts, 31 -> 26 ms for the shape test). Shared by the decode
    threads (a lock around it); emptied once it holds ``_MEMO_NAMES`` names, so a long-lived
    process that reads many traces keeps few."""

    def __init__(self, compute: Callable[[pl.Series], pl.DataFrame | np.ndarray]) -> None:
        self._compute, self._lock = compute, threading.Lock()
        self._row: dict[str, int] = {}  # a name's row in what compute told
        self._told = None

    def of(self, rows: _Rows):
        """What each row's name tells (compute's rows, gathered)."""
        codes = rows.column("name")
        used = np.zeros(len(rows.strings), dtype=bool)
        used[codes] = True
        at = np.flatnonzero(used)  # (the slice's strings that are these rows' names)
        names = [rows.strings[i] for i in at.tolist()]
        where = np.zeros(len(rows.strings), dtype=np.int64)
        with self._lock:
            row = self._row
            new = [name for name in names if name not in row]
            if len(row) + len(new) > _MEMO_NAMES:  # (it starts again from this slice's)
                row.clear()
                new, self._told = names, None
            if new:
                row.update(zip(new, range(len(row), len(row) + len(new))))
                told = self._compute(pl.Series(new, dtype=pl.String))
                self._told = told if self._told is None else _joined(self._told, told)
            where[at] = np.fromiter(map(row.__getitem__, names), dtype=np.int64, count=len(names))
            told = self._told
        return told[where[codes]]


def _joined(told, more):
    return pl.concat([told, more], rechunk=True) if isinstance(told, pl.DataFrame) else np.concatenate([told, more])


_MEMO_NAMES = 1 << 16
_FACTS, _SHAPES = _NameMemo(_k.name_facts), _NameMemo(_k.shape_ops)


def _codes(strings: list[str], mapping: dict[str, str], dtype: pl.DataType) -> pl.Series:
    """The model's name of each distinct string that is one of ``mapping``'s categories."""
    return pl.Series([mapping.get(s) for s in strings], dtype=dtype)


def _gpu_table(rows: _Rows) -> pl.DataFrame:
    """The slice's GPU activity: its records' numbers, names and kinds and what the names tell
    (``_kineto_tables.name_facts``, found once per distinct string of the trace and gathered), made
    into the GPU table's columns (``_kineto_tables.gpu_columns``) in one polars query."""
    if not rows.size:
        return pl.DataFrame(schema=_k.GPU_SCHEMA)
    i32, i64 = pl.Int32, pl.Int64
    facts = _FACTS.of(rows)
    keep = {"kind": rows.coded("cat", _codes(rows.strings, _k._GPU_CATS, _k.GPU_SCHEMA["kind"])), "name": rows.strs("name"),
            **{c: facts.get_column(c) for c in facts.columns}}  # fmt: skip
    n = rows.numbers_lazy(
        {"device": i32, "stream": i64, "correlation": i64, "external_id": i64, "external_id_old": i64, "bytes": i64,
         "registers": i32, "shared_memory": i64, **{f"{d}_{axis}": i32 for d in ("grid", "block") for axis in "xyz"}},
        keep, pid=i32, tid=i64,
    )  # fmt: skip
    return n.select(_gpu_read()).select(_k.gpu_columns()).collect(engine=_ENGINE)


@functools.cache
def _gpu_read() -> tuple[pl.Expr, ...]:
    """The GPU table's columns as read, from ``_Rows.numbers``' (the device and stream where
    the args do not say: the event's pid and tid; ``External id`` as ``_EXTERNAL_ID``)."""
    return (
        pl.col("kind"),
        pl.col("name"),
        pl.col("device").fill_null(pl.col("pid")),
        pl.col("stream").fill_null(pl.col("tid")),
        pl.col("start_ns", "dur_ns", "correlation"),
        _EXTERNAL_ID,
        pl.col("bytes", *(f"{d}_{axis}" for d in ("grid", "block") for axis in "xyz"), "registers"),
        pl.col("shared_memory").alias("shared_mem_bytes"),
        pl.col("_copy", "_src", "_dst", "_amd", "_comm"),
    )


def _cpu_table(rows: _Rows) -> pl.DataFrame:
    """The slice's operators, annotations and runtime calls, in one polars query."""
    if not rows.size:
        return pl.DataFrame(schema=_k.CPU_SCHEMA)
    i64 = pl.Int64
    # (the names' test once per distinct string of the trace, not once per operator)
    picked = np.flatnonzero(_SHAPES.of(rows))
    keep = {
        "cat": rows.coded("cat", _codes(rows.strings, _k._CPU_CATS, _k.CPU_SCHEMA["cat"])),
        "name": rows.strs("name"),
        "input_types": _shape_column(rows, picked, "input_types", _k._dtypes),
        "input_dims": _shape_column(rows, picked, "input_dims", _k._dims),
        "input_concrete": _shape_column(rows, picked, "input_concrete", _k._dims),
    }
    n = rows.numbers_lazy({"external_id": i64, "external_id_old": i64, "correlation": i64, "sequence": i64}, keep, pid=i64, tid=i64)
    return n.with_columns(_EXTERNAL_ID).select(_k.cpu_columns("python_id", "python_parent_id")).collect(engine=_ENGINE)


def _shape_column(rows: _Rows, picked: np.ndarray, name: str, decode: Callable[[bytes], str | None]) -> pl.Series:
    """An input-shape column of the operators ``picked`` (the rest null): the decoder interns
    each value's JSON text among the strings (``off:``: its index), so each distinct value
    is decoded once, as the typed path decodes each once (``kineto._shapes``), and the rows
    take theirs by one gather."""
    present = rows.column(f"len:{name}")[picked] >= 0
    distinct, inverse = np.unique(rows.column(f"off:{name}")[picked[present]], return_inverse=True)
    values = pl.Series([decode(rows.strings[i].encode()) for i in distinct.tolist()] + [None], dtype=pl.Categorical)
    which = np.full(rows.size, distinct.size, dtype=np.int64)  # (the None after the values)
    which[picked[present]] = inverse
    return values.gather(which)


def _frame_table(rows: _Rows) -> pl.DataFrame:
    """The slice's Python frames, in one polars query."""
    i64 = pl.Int64
    n = rows.numbers_lazy({"python_id": i64, "python_parent_id": i64}, {"name": rows.strs("name")}, pid=i64, tid=i64)
    return n.select(_k.frame_columns()).collect(engine=_ENGINE)


def _comm_table(ops: _Rows, cpu_ops: pl.DataFrame, payload) -> pl.DataFrame:
    """The collective calls: ``record_param_comms`` operators that name their collective
    (few), rebuilt as the decoder's structs for the usual builder."""
    calls = cpu_ops.get_column("name").eq("record_param_comms").arg_true().to_numpy() if cpu_ops.height else np.zeros(0, np.int64)
    calls = calls[ops.column("len:collective")[calls] >= 0]
    if not calls.size:  # (most slices: no polars call for an empty table)
        return _k._comm_table([])
    comm = ops.at(calls)
    raws = {name: comm.raw(payload, name) for name in ("collective", "dtype", "pg_name")}
    n = comm.numbers({name: pl.Int64 for name in ("external_id", "external_id_old", "in_nelems", "out_nelems", "group_size")})
    ints = {name: n.get_column(name).to_list() for name in n.columns if name not in ("start_ns", "dur_ns")}
    tids = [comm.strings[v] if t else v for v, t in zip(comm.column("tid").tolist(), comm.has(_TEXT["tid"]).tolist())]
    events = []
    for i, ts in enumerate(comm.column("ts").tolist()):
        text = {name: None if (v := raws[name](i)) is None else msgspec.json.decode(v) for name in raws}
        args = _k._Args(**{name: values[i] for name, values in ints.items()}, collective=text["collective"], dtype=text["dtype"],
                        pg_name=text["pg_name"])  # fmt: skip
        events.append(_k._Event(ts=None if np.isnan(ts) else ts, tid=tids[i], args=args))
    return _k._comm_table(events)
