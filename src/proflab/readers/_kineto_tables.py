"""The records and tables of a Kineto trace, shared by its two decoders: the typed msgspec
decode of ``kineto`` and the compiled one of ``_kineto_native``. The categories and what
each becomes in the model, the event records (``_Event``, ``_Args``), a slice's tables
(``_Tables``) and the polars expressions that build the GPU, host, Python-frame and
collective tables: both decoders give the same tables because both build them here, and
neither imports the other for them.
"""

from __future__ import annotations

import functools
from collections import Counter
from operator import attrgetter
from typing import Annotated, Any, NamedTuple

import msgspec
import numpy as np
import polars as pl
from msgspec import Struct, field

from proflab.model.trace import (
    COMM_KERNEL_PATTERN,
    COMM_SCHEMA,
    COPY_KINDS,
    CPU_SCHEMA,
    GPU_SCHEMA,
    MEMORY_KINDS,
    count_only,
)


# Kineto category -> model kind. The capitalised names are what PyTorch 1.x wrote.
_GPU_CATS = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
}


_CPU_CATS = {
    "cpu_op": "cpu_op",
    "Operator": "cpu_op",
    "user_annotation": "user_annotation",
    "python_function": "python_function",
    "cuda_runtime": "cuda_runtime",  # also HIP runtime calls in ROCm traces
    "Runtime": "cuda_runtime",
    "hip_runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "Driver": "cuda_driver",
    "hip_driver": "cuda_driver",
    "gpu_user_annotation": "gpu_user_annotation",
}


# Categories Kineto writes that proflab knowingly does not use (flows, spans, counters...).
_IGNORED_CATS = {
    "ac2g",
    "async",  # PyTorch 1.8-1.9 flow events (ph s/f, name "launch")
    "fwdbwd",
    "Trace",
    "cpu_instant_event",
    "overhead",
    "cuda_profiler_range",
    "cuda_sync",
    "Memory",
    "",
}


_KNOWN_CATS = _GPU_CATS.keys() | _CPU_CATS.keys() | _IGNORED_CATS


_OP_CATS = {c for c, kind in _CPU_CATS.items() if kind != "python_function"}


# Bounds the model's column types can hold; the decoder rejects anything outside them with
# the JSON path of the offending value, instead of failing later in a cast.
_I32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]


_I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


_US = Annotated[float, msgspec.Meta(ge=-9.2e15, le=9.2e15)]  # microseconds whose ns fit in int64


class _Args(Struct, frozen=True, gc=False):
    external_id: _I64 | None = field(name="External id", default=None)
    external_id_old: _I64 | None = field(name="external id", default=None)  # PyTorch 1.8-1.9
    correlation: _I64 | None = None
    device: _I32 | None = None
    stream: _I64 | None = None
    bytes: _I64 | None = None
    grid: list[_I32] | None = None
    block: list[_I32] | None = None
    registers: _I32 | None = field(name="registers per thread", default=None)
    shared_memory: _I64 | None = field(name="shared memory", default=None)
    python_id: _I64 | None = field(name="Python id", default=None)
    python_parent_id: _I64 | None = field(name="Python parent id", default=None)
    sequence: _I64 | None = field(name="Sequence number", default=None)
    # Kept raw (a slice of the input, not parsed): each distinct value is decoded once, where
    # the reader builds the columns (a model's operators repeat a few shapes).
    input_types: msgspec.Raw = field(name="Input type", default=msgspec.Raw())
    input_dims: msgspec.Raw = field(name="Input Dims", default=msgspec.Raw())  # FLOPs and bytes from shapes
    input_concrete: msgspec.Raw = field(name="Concrete Inputs", default=msgspec.Raw())  # stride, padding, is_causal...
    # torch.distributed's record_param_comms (and, from 2.x, the NCCL kernels) describe the
    # collective: what it is, its message sizes, dtype and process group
    collective: str | None = field(name="Collective name", default=None)
    in_nelems: _I64 | None = field(name="In msg nelems", default=None)
    out_nelems: _I64 | None = field(name="Out msg nelems", default=None)
    dtype: str | None = None
    pg_name: str | int | None = field(name="Process Group Name", default=None)
    group_size: _I32 | None = field(name="Group size", default=None)


_NO_ARGS = _Args()


class _Event(Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: _US | None = None  # missing (or null): the event has no place on the timeline, dropped
    dur: _US = 0.0
    args: _Args = _NO_ARGS
    id: int | str | None = None  # flow events (ph s/f): Kineto's flow id is the launch's correlation id


class _Tables(NamedTuple):
    gpu: pl.DataFrame
    cpu: pl.DataFrame
    unknown: Counter
    events: int
    problems: Counter  # (field, kind, outcome) -> count, from tolerant decoding
    comms: pl.DataFrame | None = None


_I64_MAX, _I64_MIN = 2**63 - 1, -(2**63)


def _timed(df: pl.DataFrame, problems: Counter | None) -> pl.DataFrame:
    """The rows that have a start: an event without ``ts`` (or with null) has no place on
    the timeline, so it is dropped and counted for the notes, never placed at time 0. So is
    one whose end the int64 ns clock cannot hold (a start and a duration that each fit, but
    not their sum, which would wrap to a time before the trace began)."""
    if not df.height:
        return df
    start, dur = pl.col("start_ns"), pl.col("dur_ns")
    past = ((dur > 0) & (start > _I64_MAX - dur)) | ((dur < 0) & (start < _I64_MIN - dur)) if "dur_ns" in df.columns else pl.lit(False)
    n, far = df.select(start.null_count(), past.sum()).row(0)
    if not n and not far:
        return df
    if problems is not None:
        if n:
            problems["ts", "missing", "event dropped"] += n
        if far:
            problems["dur", "ending past the clock's range", "event dropped"] += far
    return df.filter(start.is_not_null() & ~past.fill_null(False))


_FLOW_CATS = {"ac2g", "async"}


def _ns(values: list[float]) -> pl.Series:
    return pl.DataFrame({"us": pl.Series(values, dtype=pl.Float64)}).select(ns_of(pl.col("us"))).to_series()


def ns_of(us: pl.Expr) -> pl.Expr:
    """Microseconds (float) as int64 nanoseconds, as ``_ns`` does: the whole microseconds and
    their fraction apart, since a Unix-epoch timestamp (1.6e15 us, as PyTorch 1.x wrote them)
    times 1000 is past float64's exact integers and would lose ~100 ns."""
    whole = us.floor()
    return whole.cast(pl.Int64) * 1000 + ((us - whole) * 1000.0).round().cast(pl.Int64)


def _ints(values: list[Any], dtype: pl.DataType = pl.Int64) -> pl.Series:
    # pid/tid may be strings ("Spans", "stream 7" in old traces): keep the digits, else null.
    try:
        return pl.Series(values, dtype=dtype)
    except (TypeError, pl.exceptions.PolarsError):
        s = pl.Series([str(v) for v in values], dtype=pl.String)
        return s.str.extract(r"(\d+)$").cast(dtype, strict=False)  # past the dtype: null too


def _external_ids(args: list) -> pl.Series:
    """``External id``, or ``external id`` as PyTorch 1.8-1.9 spelled it on runtime calls and kernels."""
    ids = pl.Series(list(map(attrgetter("external_id"), args)), dtype=pl.Int64)
    if ids.null_count():
        old = list(map(attrgetter("external_id_old"), args))
        if old.count(None) < len(old):
            ids = ids.fill_null(pl.Series(old, dtype=pl.Int64))
    return ids


@functools.cache
def gpu_columns() -> tuple[pl.Expr, ...]:
    """The GPU table's columns (``GPU_SCHEMA``, in order) from its columns as read and the
    ``name_facts`` of each row's name: a copy's direction (a memcpy's only: unknown where its
    name does not tell), memory kinds, communication kernels, and counts as ``counts_only``
    keeps them. Built once: one select, whatever reads the table."""
    memcpy = pl.col("kind") == "memcpy"
    copy = _enum(pl.col("_copy").fill_null(pl.when(memcpy).then(pl.col("_amd"))), COPY_KINDS)
    derived = {
        # a memcpy whose name did not parse still is a memcpy, of unknown direction
        "copy_kind": pl.when(memcpy).then(copy.fill_null("unknown")).alias("copy_kind"),
        "src_kind": _enum(pl.col("_src"), MEMORY_KINDS).alias("src_kind"),
        "dst_kind": _enum(pl.col("_dst"), MEMORY_KINDS).alias("dst_kind"),
        "is_comm": (pl.col("kind") == "kernel").and_(pl.col("_comm")).alias("is_comm"),
    }
    return tuple(derived.get(c, count_only(c)) for c in GPU_SCHEMA)


def name_facts(names: pl.Series) -> pl.DataFrame:
    """What a GPU activity's name tells of it, whatever its kind: a copy's direction and
    memory kinds (CUDA's ``Memcpy HtoD (Pinned -> Device)``; ROCm names its copies after the
    direction, "CopyHostToDevice", "hipMemcpyDtoH"...: ``_amd``), and whether it names a
    communication kernel (``_comm``). A row per name."""
    copy = pl.col("name").str.extract_groups(r"^Memcpy (\w+) \((\w+) -> (\w+)\)")
    amd = pl.col("name").str.extract(r"(?i)(HostToDevice|DeviceToHost|DeviceToDevice|HostToHost|PeerToPeer|HtoD|DtoH|DtoD|HtoH)")
    return names.rename("name").to_frame().select(
        copy.struct.field("1").alias("_copy"),
        copy.struct.field("2").alias("_src"),
        copy.struct.field("3").alias("_dst"),
        amd.replace_strict(
            ["HostToDevice", "DeviceToHost", "DeviceToDevice", "HostToHost", "PeerToPeer", "HtoD", "DtoH", "DtoD", "HtoH"],
            ["HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "HtoD", "DtoH", "DtoD", "HtoH"],
            default=None,
        ).alias("_amd"),
        pl.col("name").str.contains(COMM_KERNEL_PATTERN).alias("_comm"),
    )


def _enum(expr: pl.Expr, values: list[str]) -> pl.Expr:
    return (
        pl.when(expr.is_in(values)).then(expr).when(expr.is_not_null()).then(pl.lit("unknown")).cast(pl.Enum(values))
    )


@functools.cache
def cpu_columns(*absent: str) -> tuple[pl.Expr, ...]:
    """The host table's columns (``CPU_SCHEMA``, in order), those ``absent`` a broadcast null
    each (no memory per row): one select, built once."""
    return tuple(pl.lit(None, dtype=CPU_SCHEMA[c]).alias(c) if c in absent else pl.col(c) for c in CPU_SCHEMA)


def shape_ops(names: pl.Series) -> np.ndarray:
    """Whether each name is one whose input shapes are kept: every named event (only operators
    carry them). The operator performance model (``analysis.perf``) reads the shapes of GEMMs
    and convolutions as of element-wise operators, normalisations and the optimizer, and the
    parameters of the autograd graph (``AccumulateGrad``). Where shapes were not recorded
    the columns stay null and cost nothing."""
    return names.is_not_null().to_numpy()


def _comm_table(evs: list[_Event]) -> pl.DataFrame:
    """The collective calls (few: one per collective, never per element)."""
    if not evs:
        return pl.DataFrame(schema=COMM_SCHEMA)
    args = list(map(attrgetter("args"), evs))
    return pl.DataFrame(
        {
            "external_id": _external_ids(args),
            "start_ns": _ns(list(map(attrgetter("ts"), evs))),
            "tid": _ints(list(map(attrgetter("tid"), evs))),
            "collective": [a.collective for a in args],
            "in_nelems": [a.in_nelems for a in args],
            "out_nelems": [a.out_nelems for a in args],
            "dtype": [a.dtype for a in args],
            "group": [None if a.pg_name is None else str(a.pg_name) for a in args],
            "group_size": [a.group_size for a in args],
        },
        schema=COMM_SCHEMA,
    )


_DTYPES_DECODER = msgspec.json.Decoder(list[Any])


def _dims(raw: msgspec.Raw) -> str | None:
    """The operator's input shapes (or its concrete inputs) as compact JSON (``[[m,k],[k,n]]``,
    ``["","","[1, 1]"]``), or None when malformed."""
    try:
        dims = _DTYPES_DECODER.decode(raw)
    except msgspec.DecodeError:
        return None
    return msgspec.json.encode(dims).decode() if isinstance(dims, list) else None


def _dtypes(raw: msgspec.Raw) -> str | None:
    try:
        types = _DTYPES_DECODER.decode(raw)
    except msgspec.DecodeError:
        return None
    return ",".join(map(str, types)) if isinstance(types, list) else None


@functools.cache
def frame_columns() -> tuple[pl.Expr, ...]:
    """The host table's columns for Python frames' rows (``cpu_columns``): their category
    broadcast, the operators' columns null."""
    absent = cpu_columns("external_id", "correlation", "sequence", "input_types", "input_dims", "input_concrete")
    return (pl.lit("python_function", dtype=CPU_SCHEMA["cat"]).alias("cat"), *(e for c, e in zip(CPU_SCHEMA, absent) if c != "cat"))
