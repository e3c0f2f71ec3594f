"""Tables of one slice of Kineto events from the compiled decoder (``_kscan``), the same as
the typed msgspec decode gives (``kineto._tables``), without a Python object per event.

``_kscan.scan`` turns the slice into fixed-size records and a list of its distinct strings;
here numpy splits the records into GPU activity, operators and Python frames, and the
reader's own table builders (``kineto._gpu_frame`` ...) take the columns. A slice the
decoder gives up on (any value the typed decode would not take as is, or malformed JSON),
or one whose kernels must be linked to their launches by flow events, returns None, and the
caller decodes it the usual way: what is odd is always handled by the one path that has
handled it all along. ``PROFLAB_PURE_PYTHON=1`` turns this path off.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable

import msgspec
import numpy as np
import polars as pl

from proflab.readers import kineto as _k

try:
    from proflab.readers import _kscan
except ImportError:  # built without a C compiler: the msgspec decode does it all
    _kscan = None

__all__ = ["available", "tables", "scan"]

# mirrors the record of _kscan.c
_INTS = (
    "external_id", "external_id_old", "correlation", "device", "stream", "bytes", "registers",
    "shared_memory", "python_id", "python_parent_id", "sequence", "in_nelems", "out_nelems",
    "group_size", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
)  # fmt: skip
_SPANS = ("input_types", "input_dims", "collective", "dtype", "pg_name")
_SLOT = {name: i for i, name in enumerate(_INTS)}
_SPAN = {name: i for i, name in enumerate(_SPANS)}
RECORD = np.dtype(
    [
        ("ph", "<i8"), ("cat", "<i8"), ("name", "<i8"), ("pid", "<i8"), ("tid", "<i8"),
        ("ts", "<f8"), ("dur", "<f8"),
        ("ints", "<i8", (len(_INTS),)), ("span_off", "<i8", (len(_SPANS),)), ("span_len", "<i8", (len(_SPANS),)),
        ("valid", "<u8"),
    ]
)  # fmt: skip
_TEXT = {"pid": 62, "tid": 63}  # bits of "valid": the value is a string's index
_OP, _GPU, _FRAME = 1, 2, 3


def available() -> bool:
    """Whether the compiled decoder is built and not turned off."""
    return _kscan is not None and os.environ.get("PROFLAB_PURE_PYTHON", "") in ("", "0")


def scan(payload) -> tuple[np.ndarray, list[str]] | str:
    """The slice's records and strings, or the decoder's reason for giving up."""
    got = _kscan.scan(payload)
    if isinstance(got, str):
        return got
    _, records, strings = got
    return np.frombuffer(records, RECORD), strings


class _Rows:
    """Some of a slice's records (``index``), column by column."""

    def __init__(self, rec: np.ndarray, index: np.ndarray, strings: list[str], text: pl.Series) -> None:
        self.rec, self.index, self.strings, self.text = rec, index, strings, text
        self.size = index.size
        self.valid = rec["valid"][index]

    def column(self, name: str) -> np.ndarray:
        return self.rec[name][self.index]

    def has(self, bit: int) -> np.ndarray:
        return (self.valid >> np.uint64(bit)) & np.uint64(1) == 1

    def ints(self, name: str, dtype: pl.DataType = pl.Int64) -> pl.Series:
        """An integer arg's column, null where the event did not carry it."""
        slot = _SLOT[name]
        valid = self.has(slot)
        values = pl.Series(self.rec["ints"][self.index, slot], dtype=pl.Int64)
        if not valid.all():  # (set: 20-30 us for 20k rows; when/then and scatter ~100 us)
            values = values.set(pl.Series(~valid), None)
        return values.cast(dtype)

    def ids(self, name: str, dtype: pl.DataType = pl.Int64) -> pl.Series:
        """pid or tid: integers, or where any is a string ("Spans"), as the usual path reads them."""
        values, text = self.column(name), self.has(_TEXT[name])
        if not text.any() and (dtype == pl.Int64 or (values.size and -(2**31) <= values.min() and values.max() < 2**31)):
            return pl.Series(values, dtype=dtype)
        return _k._ints([self.strings[v] if t else int(v) for v, t in zip(values.tolist(), text.tolist())], dtype)

    def strs(self, name: str) -> pl.Series:
        return self.text.gather(self.column(name))

    def coded(self, name: str, codes: pl.Series) -> pl.Series:
        """A string column through ``codes`` (a value per distinct string)."""
        return codes.gather(self.column(name))

    def start(self) -> pl.Series:
        # a null or absent ts is NaN in the records (JSON has no NaN of its own)
        return _k._ns(pl.Series(self.column("ts"), dtype=pl.Float64).fill_nan(None))

    def dur(self) -> pl.Series:
        return _k._ns(pl.Series(self.column("dur"), dtype=pl.Float64)).clip(lower_bound=0)

    def host(self) -> dict[str, pl.Series]:
        return {"name": self.strs("name"), "pid": self.ids("pid"), "tid": self.ids("tid"), "start_ns": self.start(), "dur_ns": self.dur()}

    def external_ids(self) -> pl.Series:
        return _k._or_old_ids(self.ints("external_id"), lambda: self.ints("external_id_old"))

    def raw(self, payload, name: str) -> Callable[[int], memoryview | None]:
        """Row i's raw JSON value of an arg (``Input type``...), None where absent."""
        slot, view = _SPAN[name], memoryview(payload)
        off, n = self.rec["span_off"][self.index, slot], self.rec["span_len"][self.index, slot]

        def raw(i: int) -> memoryview | None:
            return view[off[i] : off[i] + n[i]] if n[i] >= 0 else None

        return raw


def tables(payload) -> _k._Tables | None:
    """The slice's tables, or None where the usual decode must do it."""
    got = scan(payload)
    if isinstance(got, str):
        return None
    rec, strings = got
    text = pl.Series(strings, dtype=pl.String)
    kind = np.array([_kind(s) for s in strings], dtype=np.int8)
    is_x = np.array([s == "X" for s in strings], dtype=bool)
    cat = rec["cat"]
    of_kind, x = kind[cat], is_x[rec["ph"]]

    def rows(mask: np.ndarray) -> _Rows:
        return _Rows(rec, np.flatnonzero(mask), strings, text)

    counts = _first_seen_counts(cat[of_kind == 0], strings)
    unknown = Counter({c: n for c, n in counts.items() if c not in _k._KNOWN_CATS})
    gpu = _gpu_table(rows(of_kind == _GPU))
    if gpu.height and gpu.get_column("correlation").null_count() and counts.keys() & _k._FLOW_CATS:
        return None  # launches linked by flow events: the usual path does that
    ops, frames = rows((of_kind == _OP) & x), rows((of_kind == _FRAME) & x)
    cpu_ops = _cpu_table(ops, payload)
    cpu = pl.concat([cpu_ops, _frame_table(frames)]) if frames.size else cpu_ops
    comms = _comm_table(ops, cpu_ops, payload)
    problems: Counter = Counter()  # (events without a start, or ending past the clock's range)
    gpu, cpu, comms = _k._timed(gpu, problems), _k._timed(cpu, problems), _k._timed(comms, None)
    return _k._Tables(gpu, cpu, unknown, len(rec), problems, comms)


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


def _codes(strings: list[str], mapping: dict[str, str], dtype: pl.DataType) -> pl.Series:
    """The model's name of each distinct string that is one of ``mapping``'s categories."""
    return pl.Series([mapping.get(s) for s in strings], dtype=dtype)


def _gpu_table(rows: _Rows) -> pl.DataFrame:
    if not rows.size:
        return pl.DataFrame(schema=_k.GPU_SCHEMA)
    return _k._gpu_frame(
        {
            "kind": rows.coded("cat", _codes(rows.strings, _k._GPU_CATS, _k.GPU_SCHEMA["kind"])),
            "name": rows.strs("name"),
            "device": rows.ints("device", pl.Int32).fill_null(rows.ids("pid", pl.Int32)),
            "stream": rows.ints("stream").fill_null(rows.ids("tid")),
            "start_ns": rows.start(),
            "dur_ns": rows.dur(),
            "correlation": rows.ints("correlation"),
            "external_id": rows.external_ids(),
            "bytes": rows.ints("bytes"),
            **{f"{d}_{axis}": rows.ints(f"{d}_{axis}", pl.Int32) for d in ("grid", "block") for axis in "xyz"},
            "registers": rows.ints("registers", pl.Int32),
            "shared_mem_bytes": rows.ints("shared_memory"),
        }
    )


def _cpu_table(rows: _Rows, payload) -> pl.DataFrame:
    if not rows.size:
        return pl.DataFrame(schema=_k.CPU_SCHEMA)
    host = rows.host()
    types, dims = rows.raw(payload, "input_types"), rows.raw(payload, "input_dims")
    input_types, input_dims = _k._shapes(host["name"], lambda i: (types(i), dims(i)))
    return _k._cpu_frame(
        rows.coded("cat", _codes(rows.strings, _k._CPU_CATS, _k.CPU_SCHEMA["cat"])),
        host,
        rows.external_ids(),
        rows.ints("correlation"),
        rows.ints("sequence"),
        input_types,
        input_dims,
    )


def _frame_table(rows: _Rows) -> pl.DataFrame:
    return _k._frame_frame(rows.host(), rows.ints("python_id"), rows.ints("python_parent_id"))


def _comm_table(ops: _Rows, cpu_ops: pl.DataFrame, payload) -> pl.DataFrame:
    """The collective calls: ``record_param_comms`` operators that name their collective
    (few), rebuilt as the decoder's structs for the usual builder."""
    calls = cpu_ops.get_column("name").eq("record_param_comms").arg_true().to_numpy() if cpu_ops.height else np.zeros(0, np.int64)
    index = ops.index[calls]
    comm = _Rows(ops.rec, index[ops.rec["span_len"][index, _SPAN["collective"]] >= 0], ops.strings, ops.text)
    raws = {name: comm.raw(payload, name) for name in ("collective", "dtype", "pg_name")}
    ints = {name: comm.ints(name).to_list() for name in ("external_id", "external_id_old", "in_nelems", "out_nelems", "group_size")}
    tids = comm.ids("tid").to_list() if not comm.has(_TEXT["tid"]).any() else [
        comm.strings[v] if t else int(v) for v, t in zip(comm.column("tid").tolist(), comm.has(_TEXT["tid"]).tolist())
    ]  # fmt: skip
    events = []
    for i, ts in enumerate(comm.column("ts").tolist()):
        text = {name: None if (v := raws[name](i)) is None else msgspec.json.decode(v) for name in raws}
        args = _k._Args(**{name: values[i] for name, values in ints.items()}, collective=text["collective"], dtype=text["dtype"],
                        pg_name=text["pg_name"])  # fmt: skip
        events.append(_k._Event(ts=None if np.isnan(ts) else ts, tid=tids[i], args=args))
    return _k._comm_table(events)
