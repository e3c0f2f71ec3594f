"""Reader for torch.profiler / Kineto Chrome-trace JSON (PyTorch 2.0 to current).

Accepts ``export_chrome_trace`` output and ``tensorboard_trace_handler`` files
(``*.pt.trace.json``), plain or gzip-compressed. The JSON is decoded by msgspec straight
into slim typed structs holding only the fields proflab uses (the decoder is the cost that
matters on large traces), a slice of events at a time (``_slices``), and each slice is
turned into columns at once, so decoded objects never outnumber one slice.

Timestamps are microseconds (float) in the file; the model holds integer nanoseconds.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import zlib
from collections import Counter
from contextlib import contextmanager
from operator import attrgetter
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import msgspec
import polars as pl
from msgspec import Struct, field

from proflab.errors import (
    CorruptInput,
    EmptyTrace,
    SchemaError,
    TruncatedInput,
    UnsupportedFormat,
)
from proflab.model.trace import (
    COMM_KERNEL_PATTERN,
    COPY_KINDS,
    CPU_SCHEMA,
    DEVICE_SCHEMA,
    GPU_SCHEMA,
    MEMORY_KINDS,
    Trace,
    TraceMeta,
    steps_from_annotations,
)
from proflab.readers import _progress as progress
from proflab.readers._merge import merge_by_start
from proflab.readers._slices import (
    GZIP_MAGIC,
    MappedSlicer,
    NotSliceable,
    byte_chunks,
    open_slicer,
)

__all__ = ["sniff", "read", "read_bytes"]

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
    "cuda_runtime": "cuda_runtime",
    "Runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "gpu_user_annotation": "gpu_user_annotation",
}
# Categories Kineto writes that proflab knowingly does not use (flows, spans, counters...).
_IGNORED_CATS = {
    "ac2g",
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
_CAT = attrgetter("cat")


# Bounds the model's column types can hold; the decoder rejects anything outside them with
# the JSON path of the offending value, instead of failing later in a cast.
_I32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
_I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_US = Annotated[float, msgspec.Meta(ge=-9.2e15, le=9.2e15)]  # microseconds whose ns fit in int64


class _Args(Struct, frozen=True, gc=False):
    external_id: _I64 | None = field(name="External id", default=None)
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
    # Kept raw (a slice of the input, not parsed): only matmul/conv operators need their
    # dtypes, and building strings for every operator's inputs costs more than the rest.
    input_types: msgspec.Raw = field(name="Input type", default=msgspec.Raw())


_NO_ARGS = _Args()


class _Event(Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: _US = 0.0
    dur: _US = 0.0
    args: _Args = _NO_ARGS


class _DeviceProps(Struct, gc=False):
    id: int | None = None
    name: str | None = None
    numSms: int | None = None
    computeMajor: int | None = None
    computeMinor: int | None = None
    totalGlobalMem: int | None = None
    maxThreadsPerMultiprocessor: int | None = None
    regsPerMultiprocessor: int | None = None
    sharedMemPerMultiprocessor: int | None = None


class _Doc(Struct, gc=False):
    traceEvents: list[_Event]
    schemaVersion: int | str | None = None
    deviceProperties: list[_DeviceProps] | None = None
    distributedInfo: dict[str, Any] | None = None
    baseTimeNanoseconds: int | None = None
    with_stack: int | bool | None = None
    record_shapes: int | bool | None = None
    cuda_driver_version: int | None = None
    cuda_runtime_version: int | None = None
    cupti_version: int | None = None


_DECODER = msgspec.json.Decoder(_Doc | list[_Event])


def sniff(path: Path) -> bool:
    """True when the file looks like JSON (plain or gzip): Kineto is then the reader to try."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    if head.startswith(GZIP_MAGIC):
        try:
            head = zlib.decompressobj(wbits=31).decompress(head, 256)
        except zlib.error:
            return True  # gzip magic but corrupt: let read() say so precisely
    return head.lstrip()[:1] in (b"{", b"[") or head.strip() == b""


def read_bytes(path: Path) -> bytes:
    """The file's JSON bytes, gunzipped when compressed; truncation and corruption raise."""
    return b"".join(byte_chunks(path))


@contextmanager
def _no_gc():
    """Millions of short-lived decoded objects hold no reference cycles; the cyclic
    collector would only rescan them over and over (about a quarter of the read time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read(path: str | Path) -> Trace:
    """Read a Kineto trace into the model. Raises an InputError subclass on bad input."""
    with _no_gc():
        return _read(Path(path))


def _read(path: Path) -> Trace:
    try:
        doc, tables, size = _read_sliced(path)
    except (NotSliceable, msgspec.DecodeError, msgspec.ValidationError):
        # Not Kineto's own layout, or a slice that does not decode: decode the whole
        # document, which handles any valid JSON and pins errors to their exact place.
        data = read_bytes(path)
        if not data or data.isspace():
            raise EmptyTrace(path, "file is empty") from None
        size = len(data)
        doc = _decode(path, data)
        del data
        if isinstance(doc, list):  # the Chrome "JSON array" form: events only
            doc = _Doc(traceEvents=doc)
        tables = [_tables(doc.traceEvents)]
        doc.traceEvents = []
    event_count = sum(t.events for t in tables)
    if event_count == 0:
        raise EmptyTrace(path, "trace has no events (traceEvents is empty)")
    unknown: Counter[str] = Counter()
    for t in tables:
        unknown.update(t.unknown)
    gpu_parts, cpu_parts = [t.gpu for t in tables], [t.cpu for t in tables]
    tables.clear()  # the parts are now only in these lists, which the merge empties
    gpu = merge_by_start(gpu_parts)
    cpu = merge_by_start(cpu_parts)
    if gpu.height == 0 and cpu.height == 0:
        if unknown:
            found = ", ".join(f"{c!r} ({n})" for c, n in unknown.most_common(5))
            raise UnsupportedFormat(path, f"no torch.profiler/Kineto events; the event categories found are {found}")
        raise EmptyTrace(path, "trace holds no host or GPU events (only metadata)")
    notes: list[str] = []
    if unknown:
        listed = ", ".join(f"{c!r} ({n})" for c, n in unknown.most_common(5))
        notes.append(f"ignored {sum(unknown.values())} events of unrecognised categories: {listed}")
    meta = TraceMeta(
        source=str(path),
        format="kineto",
        format_version=None if doc.schemaVersion is None else str(doc.schemaVersion),
        size_bytes=size,
        event_count=event_count,
        base_time_ns=doc.baseTimeNanoseconds,
        with_stack=None if doc.with_stack is None else bool(doc.with_stack),
        record_shapes=None if doc.record_shapes is None else bool(doc.record_shapes),
        distributed=doc.distributedInfo,
        versions=_versions(doc),
        notes=tuple(notes),
    )
    return Trace(gpu=gpu, cpu=cpu, steps=steps_from_annotations(cpu), devices=_devices(doc.deviceProperties), meta=meta)


class _Tables(NamedTuple):
    gpu: pl.DataFrame
    cpu: pl.DataFrame
    unknown: Counter
    events: int


def _tables(events: list[_Event]) -> _Tables:
    """Columns for one batch of decoded events; the structs can be freed right after."""
    counts = Counter(map(_CAT, events))
    unknown = Counter({c: n for c, n in counts.items() if c not in _KNOWN_CATS})
    gpu_evs = [e for e in events if e.cat in _GPU_CATS] if counts.keys() & _GPU_CATS.keys() else []
    frames = [e for e in events if e.cat == "python_function" and e.ph == "X"] if "python_function" in counts else []
    ops = [e for e in events if e.cat in _OP_CATS and e.ph == "X"]
    cpu = pl.concat([_cpu_table(ops), _frame_table(frames)]) if frames else _cpu_table(ops)
    return _Tables(_gpu_table(gpu_evs), cpu, unknown, len(events))


_CHUNK_BYTES = 32 << 20
_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])


def _slice_tables(payload: bytes | bytearray | memoryview) -> _Tables:
    """Tables for one slice: a JSON array of events (see ``_slices``)."""
    return _tables(_EVENTS_DECODER.decode(payload))


def _read_sliced(path: Path) -> tuple[_Doc, list[_Tables], int]:
    """Decode the file slice by slice (see ``_slices``); a large plain file is split with a
    helper process (``_worker``). Raises NotSliceable (or a decode error) for the caller to
    fall back on a whole-document decode."""
    slicer = open_slicer(path, _CHUNK_BYTES)
    tables: list[_Tables] = []
    try:
        if isinstance(slicer, MappedSlicer):
            ranges = slicer.plan()
            ours, theirs = _split(ranges)
            share = sum(stop - begin for begin, stop in ours) or 1
            done = 0
            with _Helper(path, theirs) as helper:
                for begin, stop in ours:
                    piece = slicer.piece(begin, stop)
                    tables.append(_slice_tables(piece))
                    slicer.done(piece)
                    done += stop - begin
                    progress.update(done / share)  # the helper keeps about the same pace
                helped = helper.result()
            if helped is None:  # no helper, or it failed: do its share here
                for begin, stop in theirs:
                    piece = slicer.piece(begin, stop)
                    tables.append(_slice_tables(piece))
                    slicer.done(piece)
            else:
                tables.extend(helped)
        else:
            for piece in slicer.pieces():
                tables.append(_slice_tables(piece))
                slicer.done(piece)
                progress.update(None)  # compressed: the total is not known ahead
        document, size = slicer.document(), slicer.size
    finally:
        slicer.close()
    doc = msgspec.json.decode(document, type=_Doc)
    return doc, tables, size


# A trace of at least this many slices (320 MiB) is shared with a helper process on a
# machine with two or more cores. It gets the second half of the file. A second interpreter
# with polars costs ~130 MiB more at once: below this size the memory bound (0.4 x the trace
# + 300 MB) has no room for it (163 MB trace: 209 MiB alone, 336-349 MiB with the helper).
_HELPER_FROM_SLICES = 10
_HELPER_SHARE = 0.5


def _split(ranges: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    if len(ranges) < _HELPER_FROM_SLICES or not _helper_allowed():
        return ranges, []
    k = len(ranges) - int(len(ranges) * _HELPER_SHARE)
    return ranges[:k], ranges[k:]


def _helper_allowed() -> bool:
    """One helper process on multi-core machines; PROFLAB_READ_PROCESSES=1 reads in one."""
    if os.environ.get("PROFLAB_READ_PROCESSES", "").strip() == "1":
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores >= 2


class _Helper:
    """Runs ``proflab.readers._worker`` over some slices while the caller decodes the rest.
    ``result()`` gives its tables, or None when there was nothing to do or it failed."""

    def __init__(self, path: Path, ranges: list[tuple[int, int]]) -> None:
        self.ranges = ranges
        self.proc: subprocess.Popen | None = None
        self.tmp: tempfile.TemporaryDirectory | None = None
        if not ranges:
            return
        self.tmp = tempfile.TemporaryDirectory(prefix="proflab-read-")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "proflab.readers._worker", str(path), self.tmp.name],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
            )
            self.proc.stdin.write(json.dumps(ranges).encode())
            self.proc.stdin.close()
        except OSError:
            self._stop()

    def result(self) -> list[_Tables] | None:
        if self.proc is None or self.tmp is None:
            return None
        try:
            if self.proc.wait() != 0:
                return None
            out = Path(self.tmp.name)
            meta = json.loads((out / "meta.json").read_text())
            # one file per slice: the helper never holds more than one slice's tables
            parts = [
                (pl.read_ipc(out / f"gpu-{i}.arrow"), pl.read_ipc(out / f"cpu-{i}.arrow"))
                for i in range(int(meta["slices"]))
            ]
        except (OSError, ValueError, KeyError, pl.exceptions.PolarsError):
            return None
        if any(dict(g.schema) != GPU_SCHEMA or dict(c.schema) != CPU_SCHEMA for g, c in parts):
            return None
        return [_Tables(g, c, Counter(meta["unknown"]) if i == 0 else Counter(), int(meta["events"]) if i == 0 else 0)
                for i, (g, c) in enumerate(parts)]

    def _stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> _Helper:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:  # interrupted or failed: never leave the helper behind
            self._stop()
        elif self.proc is not None:
            self.proc.wait()
        if self.tmp is not None:
            self.tmp.cleanup()


def _cuda_version(v: int | None) -> str | None:
    # CUDA encodes 13.0 as 13000 and CUPTI 13.0.1 as 130001.
    if v is None:
        return None
    if v >= 100000:
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    return f"{v // 1000}.{v // 10 % 100}"


def _versions(doc: _Doc) -> dict[str, str]:
    found = {
        "kineto_schema": None if doc.schemaVersion is None else str(doc.schemaVersion),
        "cuda_driver": _cuda_version(doc.cuda_driver_version),
        "cuda_runtime": _cuda_version(doc.cuda_runtime_version),
        "cupti": _cuda_version(doc.cupti_version),
    }
    return {k: v for k, v in found.items() if v is not None}


def _decode(path: Path, data: bytes) -> _Doc | list[_Event]:
    try:
        return _DECODER.decode(data)
    except msgspec.ValidationError as e:
        msg = str(e)
        if "missing required field `traceEvents`" in msg:
            raise UnsupportedFormat(path, "JSON, but not a profiler trace: it has no 'traceEvents' array") from e
        if msg.startswith("Expected `object | array`"):
            raise UnsupportedFormat(path, f"JSON, but not a profiler trace ({msg})") from e
        raise SchemaError(path, f"unexpected trace content: {msg.replace('$[...]', '$')}") from e
    except msgspec.DecodeError as e:
        msg = str(e)
        if "truncated" in msg:
            raise TruncatedInput(path, "JSON ends early (truncated file)") from e
        raise CorruptInput(path, f"not valid JSON ({msg})") from e


def _ns(values: list[float]) -> pl.Series:
    return (pl.Series(values, dtype=pl.Float64) * 1000.0).round().cast(pl.Int64)


def _ints(values: list[Any], dtype: pl.DataType = pl.Int64) -> pl.Series:
    # pid/tid may be strings ("Spans", "stream 7" in old traces): keep the digits, else null.
    try:
        return pl.Series(values, dtype=dtype)
    except (TypeError, pl.exceptions.PolarsError):
        s = pl.Series([str(v) for v in values], dtype=pl.String)
        return s.str.extract(r"(\d+)$").cast(dtype)


def _xyz(values: list[list[int] | None], axis: int) -> pl.Series:
    # A comprehension beats building a polars List column from Python lists by ~20x.
    return pl.Series([v[axis] if v is not None and len(v) > axis else None for v in values], dtype=pl.Int32)


def _gpu_table(evs: list[_Event]) -> pl.DataFrame:
    if not evs:
        return pl.DataFrame(schema=GPU_SCHEMA)
    get = attrgetter
    args = list(map(get("args"), evs))
    device = pl.Series(list(map(get("device"), args)), dtype=pl.Int32)
    stream = pl.Series(list(map(get("stream"), args)), dtype=pl.Int64)
    grid = list(map(get("grid"), args))
    block = list(map(get("block"), args))
    df = pl.DataFrame(
        {
            "kind": pl.Series([_GPU_CATS[c] for c in map(get("cat"), evs)], dtype=pl.Enum(["kernel", "memcpy", "memset"])),
            "name": pl.Series(list(map(get("name"), evs)), dtype=pl.String),
            "device": device.fill_null(_ints(list(map(get("pid"), evs)), pl.Int32)),
            "stream": stream.fill_null(_ints(list(map(get("tid"), evs)))),
            "start_ns": _ns(list(map(get("ts"), evs))),
            "dur_ns": _ns(list(map(get("dur"), evs))).clip(lower_bound=0),
            "correlation": pl.Series(list(map(get("correlation"), args)), dtype=pl.Int64),
            "external_id": pl.Series(list(map(get("external_id"), args)), dtype=pl.Int64),
            "bytes": pl.Series(list(map(get("bytes"), args)), dtype=pl.Int64),
            "grid_x": _xyz(grid, 0),
            "grid_y": _xyz(grid, 1),
            "grid_z": _xyz(grid, 2),
            "block_x": _xyz(block, 0),
            "block_y": _xyz(block, 1),
            "block_z": _xyz(block, 2),
            "registers": pl.Series(list(map(get("registers"), args)), dtype=pl.Int32),
            "shared_mem_bytes": pl.Series(list(map(get("shared_memory"), args)), dtype=pl.Int64),
        }
    )
    copy = pl.col("name").str.extract_groups(r"^Memcpy (\w+) \((\w+) -> (\w+)\)")
    df = df.with_columns(
        _enum(copy.struct.field("1"), COPY_KINDS).alias("copy_kind"),
        _enum(copy.struct.field("2"), MEMORY_KINDS).alias("src_kind"),
        _enum(copy.struct.field("3"), MEMORY_KINDS).alias("dst_kind"),
        (pl.col("kind") == "kernel").and_(pl.col("name").str.contains(COMM_KERNEL_PATTERN)).alias("is_comm"),
    ).with_columns(
        # a memcpy whose name did not parse still is a memcpy, of unknown direction
        pl.when(pl.col("kind") == "memcpy").then(pl.col("copy_kind").fill_null("unknown")).alias("copy_kind"),
    )
    return df.select(list(GPU_SCHEMA))


def _enum(expr: pl.Expr, values: list[str]) -> pl.Expr:
    return (
        pl.when(expr.is_in(values)).then(expr).when(expr.is_not_null()).then(pl.lit("unknown")).cast(pl.Enum(values))
    )


def _host_columns(evs: list[_Event]) -> dict[str, pl.Series]:
    get = attrgetter
    return {
        "name": pl.Series(list(map(get("name"), evs)), dtype=pl.String),
        "pid": _ints(list(map(get("pid"), evs))),
        "tid": _ints(list(map(get("tid"), evs))),
        "start_ns": _ns(list(map(get("ts"), evs))),
        "dur_ns": _ns(list(map(get("dur"), evs))).clip(lower_bound=0),
    }


def _cpu_table(evs: list[_Event]) -> pl.DataFrame:
    """Operators, annotations and runtime/driver calls (everything but Python frames)."""
    if not evs:
        return pl.DataFrame(schema=CPU_SCHEMA)
    get = attrgetter
    args = list(map(get("args"), evs))
    types = pl.Series(
        [
            _dtypes(raw) if raw and (name in _DTYPE_OPS or name.startswith(_DTYPE_OP_PREFIXES)) else None
            for name, raw in zip(map(get("name"), evs), map(get("input_types"), args))
        ],
        dtype=pl.String,
    )
    return pl.DataFrame(
        {
            "cat": pl.Series([_CPU_CATS[c] for c in map(get("cat"), evs)], dtype=CPU_SCHEMA["cat"]),
            **_host_columns(evs),
            "external_id": pl.Series(list(map(get("external_id"), args)), dtype=pl.Int64),
            "correlation": pl.Series(list(map(get("correlation"), args)), dtype=pl.Int64),
            "sequence": pl.Series(list(map(get("sequence"), args)), dtype=pl.Int64),
            "input_types": types,
        }
    ).with_columns(_nulls("python_id", "python_parent_id")).select(list(CPU_SCHEMA))


def _nulls(*names: str) -> list[pl.Expr]:
    """Columns these rows never fill: one broadcast null each, no memory per row."""
    return [pl.lit(None, dtype=CPU_SCHEMA[n]).alias(n) for n in names]


# Operators whose input dtypes tell whether their GEMMs can use tensor cores.
_DTYPE_OPS = frozenset(
    f"aten::{op}" for op in ("mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_addmm_activation", "einsum")
)
_DTYPE_OP_PREFIXES = ("aten::conv", "aten::_conv", "aten::cudnn_conv", "aten::miopen_conv")
_DTYPES_DECODER = msgspec.json.Decoder(list[Any])


def _dtypes(raw: msgspec.Raw) -> str | None:
    try:
        types = _DTYPES_DECODER.decode(raw)
    except msgspec.DecodeError:
        return None
    return ",".join(map(str, types)) if isinstance(types, list) else None


def _frame_table(evs: list[_Event]) -> pl.DataFrame:
    """Python frames (with_stack): only what the source-line walk needs."""
    args = list(map(attrgetter("args"), evs))
    n = len(evs)
    return pl.DataFrame(
        {
            "cat": pl.Series(["python_function"] * n, dtype=CPU_SCHEMA["cat"]),
            **_host_columns(evs),
            "python_id": pl.Series(list(map(attrgetter("python_id"), args)), dtype=pl.Int64),
            "python_parent_id": pl.Series(list(map(attrgetter("python_parent_id"), args)), dtype=pl.Int64),
        }
    ).with_columns(_nulls("external_id", "correlation", "sequence", "input_types")).select(list(CPU_SCHEMA))


def _devices(props: list[_DeviceProps] | None) -> pl.DataFrame:
    if not props:
        return pl.DataFrame(schema=DEVICE_SCHEMA)
    rows = [
        {
            "device": p.id,
            "name": p.name,
            "sm_count": p.numSms,
            "compute_major": p.computeMajor,
            "compute_minor": p.computeMinor,
            "total_memory_bytes": p.totalGlobalMem,
            "max_threads_per_sm": p.maxThreadsPerMultiprocessor,
            "regs_per_sm": p.regsPerMultiprocessor,
            "shared_mem_per_sm_bytes": p.sharedMemPerMultiprocessor,
        }
        for p in props
    ]
    return pl.DataFrame(rows, schema=DEVICE_SCHEMA)
