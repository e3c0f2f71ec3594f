"""GPU-memory sources: Kineto ``[memory]`` events, CUDA memory snapshots, NVML samples.

``kineto_memory(path)``  the per-allocation instant events that ``profile_memory=True`` writes
                         (``Bytes`` > 0 an allocation, < 0 a free; ``Total Allocated`` and
                         ``Total Reserved`` after it; ``Device Id``, ``Device Type`` (1 CUDA,
                         0 CPU), ``Addr``). Host-timestamped: the allocator runs on the host
                         when the op is dispatched, not when the GPU runs it.
``snapshot(path)``       ``torch.cuda.memory._snapshot()`` as ``proflab run --memory-snapshot``
                         writes it (gzipped JSON, converted inside the profiled process), or
                         a ``_dump_snapshot`` pickle read by an unpickler that refuses every
                         global: a snapshot holds only dicts, lists, strings and numbers, so
                         a pickle that names any class or function is not a snapshot and is
                         refused unexecuted.
``nvml_memory(run_dir)`` used/total device memory from a run directory's ``monitor.parquet``.

Times are integer nanoseconds in the trace's own clock (Kineto ``ts`` in us x 1000), the
same clock as :class:`proflab.model.Trace`'s tables.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import pickle
import zlib
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import polars as pl

from proflab.errors import CorruptInput, InputNotFound, TruncatedInput, UnsupportedFormat

__all__ = ["MEMORY_SCHEMA", "kineto_memory", "snapshot", "snapshot_summary", "looks_like_snapshot", "nvml_memory", "SafeUnpickler"]

MEMORY_SCHEMA: dict[str, pl.DataType] = {
    "ts_ns": pl.Int64,
    "pid": pl.Int64,
    "tid": pl.Int64,
    "device": pl.Int32,  # -1: host memory
    "device_type": pl.Int32,  # 1: CUDA, 0: CPU (c10::DeviceType)
    "bytes": pl.Int64,  # > 0 allocated, < 0 freed
    "total_allocated": pl.Int64,  # after this event, on this device
    "total_reserved": pl.Int64,
    "addr": pl.Int64,
}


class _Args(msgspec.Struct):
    total_reserved: int | float | None = msgspec.field(name="Total Reserved", default=None)
    total_allocated: int | float | None = msgspec.field(name="Total Allocated", default=None)
    nbytes: int | float | None = msgspec.field(name="Bytes", default=None)
    device: int | None = msgspec.field(name="Device Id", default=None)
    device_type: int | None = msgspec.field(name="Device Type", default=None)
    addr: int | None = msgspec.field(name="Addr", default=None)



class _Ev(msgspec.Struct):
    name: str = ""
    ts: float = 0.0
    pid: int | str = 0
    tid: int | str = 0
    args: msgspec.Raw = msgspec.Raw(b"null")



class _Doc(msgspec.Struct):
    traceEvents: list[_Ev] = []
    profile_memory: int | bool | None = None


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise InputNotFound(path, "no such file")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except EOFError as e:
            raise TruncatedInput(path, "the gzip stream ends early") from e
        except (OSError, zlib.error) as e:
            raise CorruptInput(path, f"not a readable gzip file ({e})") from e
    return raw


def kineto_memory(path: str | Path) -> tuple[pl.DataFrame, bool, int]:
    """The ``[memory]`` events of a Kineto trace, sorted by time (stable: the allocator's
    order within one timestamp is kept), whether the trace says ``profile_memory`` was on,
    and how many ``[memory]`` events were dropped: without their sizes, or with a value no
    column can hold (a time whose ns leave int64, a size beyond int64, a device id beyond
    int32). A trace recorded without it has no rows."""
    path = Path(path)
    data = _read_bytes(path)
    on = b'"profile_memory": 1' in data[-4096:] or b'"profile_memory":1' in data[-4096:] or b'"profile_memory": true' in data[-4096:]
    if b'"[memory]"' not in data:
        return pl.DataFrame(schema=MEMORY_SCHEMA), on, 0

    events = _memory_objects(data)
    if events is None:  # not laid out as Kineto writes it: decode the whole document
        try:
            doc = msgspec.json.decode(data, type=_Doc)
        except msgspec.ValidationError as e:
            raise UnsupportedFormat(path, f"not a Kineto trace ({e})") from e
        except msgspec.DecodeError as e:
            raise CorruptInput(path, f"not valid JSON ({e})") from e
        events, on = doc.traceEvents, on or bool(doc.profile_memory)
    rows: dict[str, list] = {k: [] for k in MEMORY_SCHEMA}
    dec = msgspec.json.Decoder(_Args)
    bad = 0
    for e in events:
        if e.name != "[memory]":
            continue
        try:
            a = dec.decode(e.args)
        except msgspec.DecodeError:
            bad += 1
            continue
        row = _row(e, a)
        if row is None:
            bad += 1
            continue
        for k, v in zip(MEMORY_SCHEMA, row):
            rows[k].append(v)
    df = pl.DataFrame(rows, schema=MEMORY_SCHEMA)
    # the event order in the file is the allocator's order; sort by time only, stably
    df = df.with_row_index("seq").sort("ts_ns", "seq", maintain_order=True).drop("seq")
    return df, on, bad


_I64 = (-(2**63), 2**63 - 1)
_I32 = (-(2**31), 2**31 - 1)


def _fits(v: Any, bounds: tuple[int, int]) -> int | None:
    """``v`` as an integer if it is one (or a whole float) within ``bounds``, else None."""
    if isinstance(v, float):
        if not v.is_integer():
            return None
        v = int(v)
    return v if isinstance(v, int) and bounds[0] <= v <= bounds[1] else None


def _row(e: _Ev, a: _Args) -> tuple | None:
    """One event's values in ``MEMORY_SCHEMA`` order, or None when a required value is missing
    or one does not fit its column (a damaged trace: never a wrapped or clipped number)."""
    ts_ns = round(e.ts * 1000) if math.isfinite(e.ts * 1000) else None  # (1e308 us: inf ns)
    nbytes, total = _fits(a.nbytes, _I64), _fits(a.total_allocated, _I64)
    reserved = None if a.total_reserved is None else _fits(a.total_reserved, _I64)
    device = -1 if a.device is None else _fits(a.device, _I32)
    device_type = None if a.device_type is None else _fits(a.device_type, _I32)
    addr = None if a.addr is None else _fits(a.addr, _I64)
    if (ts_ns is None or _fits(ts_ns, _I64) is None or nbytes is None or total is None or device is None
            or (a.total_reserved is not None and reserved is None) or (a.device_type is not None and device_type is None)
            or (a.addr is not None and addr is None)):  # fmt: skip
        return None
    pid = _fits(e.pid, _I64) if isinstance(e.pid, int) else None
    tid = _fits(e.tid, _I64) if isinstance(e.tid, int) else None
    return ts_ns, pid, tid, device, device_type, nbytes, total, reserved, addr


_EV_DECODER = msgspec.json.Decoder(_Ev)


def _memory_objects(data: bytes) -> list[_Ev] | None:
    """The ``[memory]`` event objects alone, found by their name and decoded one by one, so a
    large trace is not decoded a second time. Kineto writes each as one flat object whose only
    nested object is ``args``; anything else (None) falls back to decoding the document."""
    out = []
    key = b'"[memory]"'
    p = data.find(key)
    try:
        while p != -1:
            start = data.rfind(b"{", 0, p)
            a = data.find(b'"args"', p)
            nxt = data.find(key, p + 1)
            if start < 0 or a < 0 or (nxt != -1 and a > nxt) or b"}" in data[start:p]:
                return None
            close_args = data.find(b"}", data.find(b"{", a))
            end = data.find(b"}", close_args + 1)
            ev = _EV_DECODER.decode(data[start : end + 1])
            if ev.name != "[memory]":
                return None
            out.append(ev)
            p = nxt
    except msgspec.DecodeError:
        return None
    return out


class SafeUnpickler(pickle.Unpickler):
    """Loads only builtin containers and scalars: every global (class, function, module
    attribute) is refused, so a pickle cannot run code while it is read."""

    def find_class(self, module: str, name: str):  # noqa: D102
        raise pickle.UnpicklingError(f"refused to load the global {module}.{name}: a memory snapshot holds none")


def looks_like_snapshot(path: Path) -> bool:
    """A pickle (any pickle: it is a snapshot or refused), or JSON whose first key is a
    snapshot's; a trace starts with other keys."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
        if head[:2] == b"\x1f\x8b":
            head = zlib.decompressobj(wbits=31).decompress(head, 256)
    except (OSError, zlib.error):
        return False
    if head[:1] == b"\x80":
        return True
    text = head.lstrip()[:64]
    return text.startswith(b"{") and text[1:].lstrip().startswith((b'"segments"', b'"device_traces"'))


def snapshot(path: str | Path) -> dict[str, Any]:
    """A CUDA memory snapshot (``segments``, ``device_traces``): gzipped or plain JSON, or a
    pickle read without loading any global. Raises an input error naming the file."""
    path = Path(path)
    data = _read_bytes(path)
    if data[:1] in (b"{", b"["):
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise CorruptInput(path, f"not valid JSON ({e})") from e
    elif data[:1] == b"\x80":  # pickle protocol 2+
        try:
            doc = SafeUnpickler(io.BytesIO(data)).load()
        except pickle.UnpicklingError as e:
            raise UnsupportedFormat(path, f"not a memory snapshot, refused: {e}") from e
        except (EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            raise CorruptInput(path, f"not a readable pickle ({type(e).__name__}: {e})") from e
    else:
        raise UnsupportedFormat(path, "not a memory snapshot (expected JSON or a torch.cuda.memory._dump_snapshot pickle)")
    if not isinstance(doc, dict) or "segments" not in doc:
        raise UnsupportedFormat(path, "not a memory snapshot (no 'segments')")
    return doc


def snapshot_summary(doc: dict[str, Any], top: int = 8) -> dict[str, Any]:
    """Per device: reserved (segment) and allocated (active block) bytes at the moment the
    snapshot was taken, and the allocation sites that hold the most, from the blocks' frames."""
    devs: dict[int, dict[str, Any]] = {}
    sites: dict[tuple[int, str], list[int]] = {}
    for seg in doc.get("segments") or []:
        if not isinstance(seg, dict):
            continue
        d = int(seg.get("device", 0) or 0)
        s = devs.setdefault(d, {"device": d, "segments": 0, "reserved_bytes": 0, "allocated_bytes": 0, "active_blocks": 0})
        s["segments"] += 1
        s["reserved_bytes"] += int(seg.get("total_size") or 0)
        for b in seg.get("blocks") or []:
            if not isinstance(b, dict) or b.get("state") != "active_allocated":
                continue
            size = int(b.get("requested_size") or b.get("size") or 0)
            s["allocated_bytes"] += size
            s["active_blocks"] += 1
            site = _frame_site(b.get("frames") or [])
            v = sites.setdefault((d, site), [0, 0])
            v[0] += size
            v[1] += 1
    out = []
    for d, s in sorted(devs.items()):
        top_sites = sorted(((k[1], v) for k, v in sites.items() if k[0] == d), key=lambda kv: -kv[1][0])[:top]
        s["top_sites"] = [{"site": k, "bytes": v[0], "blocks": v[1]} for k, v in top_sites]
        out.append(s)
    traces = doc.get("device_traces") or []
    n_events = sum(len(t) for t in traces if isinstance(t, list))
    return {"devices": out, "trace_events": n_events}


def _frame_site(frames: list) -> str:
    """The first frame outside torch itself (the user's line), else the innermost frame."""
    first = first_py = None
    for f in frames:
        if not isinstance(f, dict):
            continue
        name = str(f.get("filename", ""))
        where = f"{name.rsplit('/', 1)[-1]}:{f.get('line')} {f.get('name', '')}".strip()
        first = first or where
        if name.endswith(".py"):
            first_py = first_py or where
            if "/torch/" not in name:
                return where
    return first_py or first or "(no frames recorded)"


def nvml_memory(run_dir: str | Path) -> pl.DataFrame | None:
    """``time_ns, device, mem_used_bytes, mem_total_bytes`` from a run directory's monitor
    (None when the run has no monitor or it recorded no memory column)."""
    p = Path(run_dir) / "monitor.parquet"
    if not p.is_file():
        return None
    from proflab.readers.monitor import read_monitor

    df = read_monitor(p)  # (a damaged file: CorruptInput, which the caller notes)
    need = {"time_ns", "device", "mem_used_bytes", "mem_total_bytes"}
    if not need <= set(df.columns):
        return None
    df = df.select(sorted(need)).drop_nulls("mem_used_bytes")
    return df if df.height else None


def as_numpy(df: pl.DataFrame, col: str) -> np.ndarray:
    return df[col].to_numpy()
