"""A trace with the findings marked on it, for ui.perfetto.dev and chrome://tracing.

Output: Trace Event Format JSON (gzip when the file name ends ``.gz``, xz when ``.xz``), written through a
temporary file and a rename. It holds

- the original events: a torch.profiler/Kineto trace's own ``traceEvents`` byte for byte
  (with its other top-level fields), copied as raw JSON, never as Python objects; for an
  Nsight Systems export, a sliced read (``--steps``/``--window``), a Kineto file of more than
  ``MAX_PASSTHROUGH_BYTES`` of JSON, or one with events a viewer would reject (a mistyped
  field proflab's tolerant reader got past), the events of the model instead (every kernel,
  copy, set, operator, annotation, Python frame and runtime call, with name, time,
  device/stream or process/thread and ids) — the ``proflab`` entry of ``otherData`` says
  which, and why;
- process ``proflab: idle gaps``: one thread per device, one slice per idle gap named by its
  cause (``sync: cudaStreamSynchronize``, ``host``, ``launch``, ``dependency``, ``unknown``);
- process ``proflab: findings``: one thread per finding (and device, and lane where its
  slices overlap), slices over the stretches it is about — named ``id: title``, args the
  evidence, the gain, the fix and ``marked`` (what the slices are: which gaps, which kernels);
- process ``proflab: GPU-side steps``: one thread per device, one slice per step;
- process ``proflab: counters``: GPU busy (%) per device in fixed bins, and, for a run
  directory with ``monitor.parquet``, NVML power (W) per GPU over the trace's span.

Times: the model's integer ns are Kineto's microseconds x 1000, so ``ts = start_ns / 1000``
lands the added events on the original ones.
"""

from __future__ import annotations

import gzip
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import msgspec
import numpy as np
import polars as pl

from proflab._io import atomic_path
from proflab.errors import UsageError

__all__ = ["write_perfetto", "MAX_PASSTHROUGH_BYTES", "BUSY_BINS"]

# Above this much JSON (uncompressed) the original events are not copied verbatim: the copy
# holds the whole document in memory once (never as Python objects). The model's events are
# written instead, and the file says so.
MAX_PASSTHROUGH_BYTES = 1 * 2**30
BUSY_BINS = 1000  # busy-counter points per device over the analysed window (bins >= 10 us)
_MIN_BIN_NS = 10_000
MAX_SLICES_PER_FINDING = 20_000

_PROCESSES = ("proflab: findings", "proflab: idle gaps", "proflab: GPU-side steps", "proflab: counters")
_GAP_CATEGORY = {"sync_bound": "sync", "host_bound": "host", "launch_bound": "launch"}
_KERNEL_CATEGORIES = {
    "tensor_cores_unused", "memory_bound", "compute_bound", "latency_bound", "low_occupancy", "warp_stalls",
    "uncoalesced_access", "bank_conflicts", "divergence",
}  # fmt: skip


def _us(ns) -> float:
    return round(float(ns) / 1000.0, 3)


def _clean(v: Any) -> Any:
    """JSON-safe args: NaN/inf become null (the format has no NaN), tuples lists."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return _clean(float(v))
    return v


class _Tracks:
    """pid/tid allocation and the metadata events that name them."""

    def __init__(self, base_pid: int) -> None:
        self.base = base_pid
        self.meta: list[dict] = []
        self._named: set[tuple[int, int]] = set()
        for i, name in enumerate(_PROCESSES):
            pid = base_pid + i
            self.meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
            self.meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -100 + i}})

    def pid(self, process: str) -> int:
        return self.base + _PROCESSES.index(process)

    def thread(self, process: str, tid: int, name: str) -> tuple[int, int]:
        pid = self.pid(process)
        if (pid, tid) not in self._named:
            self._named.add((pid, tid))
            self.meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            self.meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        return pid, tid


def _lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Greedy lane per span (spans sorted by start) so that no two spans in a lane overlap:
    a viewer drops or mis-nests overlapping complete events on one thread."""
    lane_end: list[int] = []
    out = np.zeros(starts.size, dtype=np.int64)
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
        for k, le in enumerate(lane_end):
            if s >= le:
                lane_end[k] = e
                out[i] = k
                break
        else:
            lane_end.append(e)
            out[i] = len(lane_end) - 1
    return out


def _gap_events(tracks: _Tracks, gaps: pl.DataFrame) -> Iterator[bytes]:
    """One slice per idle gap, as JSON fragments of ``_GAP_CHUNK_ROWS`` gaps written by polars
    (a gap per kernel: millions; as a dict each, in Python, the 1 GB export's 2.2 M took 12 s).
    A gap after a sync call names it (``sync_call``); the others have no such arg."""
    pid = tracks.pid("proflab: idle gaps")
    for dev in gaps.get_column("device").unique().sort().to_list():
        tracks.thread("proflab: idle gaps", int(dev), f"GPU {dev} idle, by cause")
    cause, sync = pl.col("cause").cast(pl.String), pl.col("sync_name")
    has_sync = (sync.is_not_null() & (sync != "")).alias("_sync")
    event = [
        pl.lit("X").alias("ph"),
        pl.lit("proflab.gap").alias("cat"),
        pl.when((cause == "sync") & pl.col("_sync")).then(pl.concat_str([cause, pl.lit(": "), sync])).otherwise(cause).alias("name"),
        pl.lit(pid, dtype=pl.Int64).alias("pid"),
        pl.col("device").cast(pl.Int64).alias("tid"),
        pl.col("ts"),
        pl.col("dur"),
    ]
    args = [cause.alias("cause"), pl.col("dur").alias("idle_us"), pl.col("step"), pl.col("launch_name").alias("ended_by_launch")]
    for first in range(0, gaps.height, _GAP_CHUNK_ROWS):
        part = gaps.slice(first, _GAP_CHUNK_ROWS)
        part = part.with_columns(_us_array(part.get_column("start_ns")).alias("ts"), _us_array(part.get_column("dur_ns")).alias("dur"),
                                 has_sync)
        pieces = [
            _json_rows(group.select(*event, pl.struct(args + ([sync.alias("sync_call")] if synced else [])).alias("args")))
            for (synced,), group in part.partition_by("_sync", as_dict=True, maintain_order=True).items()
        ]
        yield b",".join(p for p in pieces if p)


# (the gaps are written beside the whole analysis; chunks of 200 k rows peaked 36 MiB higher on
# the 1 GB export, over its bound)
_GAP_CHUNK_ROWS = 50_000


def _json_rows(df: pl.DataFrame, last: bytes = b"") -> bytes:
    """Each row of ``df`` a JSON object, ``last`` added as its last member, joined by commas
    (polars ends each object with its line, and no newline is inside one: JSON escapes it)."""
    text = df.write_ndjson().encode()
    if last:
        text = text.replace(b"}\n", last + b"}\n")
    return text.rstrip(b"\n").replace(b"\n", b",")


def _step_events(tracks: _Tracks, steps: pl.DataFrame) -> list[dict]:
    out = []
    for r in steps.iter_rows(named=True):
        dev = r["device"]
        tid = -1 if dev is None else int(dev)
        pid, tid = tracks.thread("proflab: GPU-side steps", tid + 1,
                                 "host-side steps" if dev is None else f"GPU {dev} steps ({r['side']} side)")
        args = {"step": r["step"], "side": str(r["side"]), "dur_ms": round(r["dur_ns"] / 1e6, 3)}
        if r.get("cpu_dur_ns") is not None:
            args["host_step_ms"] = round(r["cpu_dur_ns"] / 1e6, 3)
        if r.get("busy_pct") is not None:
            args["gpu_busy_pct"] = round(float(r["busy_pct"]), 2)
        out.append({"ph": "X", "cat": "proflab.step", "name": f"step {r['step']}", "pid": pid, "tid": tid,
                    "ts": _us(r["start_ns"]), "dur": _us(r["dur_ns"]), "args": args})
    return out


def _finding_spans(f, ctx) -> tuple[pl.DataFrame, str]:
    """The stretches a finding is about (device, start_ns, end_ns, label) and what they are."""
    trace = ctx.trace
    cols = ["device", "start_ns", "end_ns", "label"]
    steps = [s for s in (f.where or {}).get("steps", []) if isinstance(s, int)]
    cause = _GAP_CATEGORY.get(f.category)
    if f.id == "sync_copy_apis":
        apis = [a.get("api") for a in f.evidence.get("apis", [])]
        g = ctx.gaps.filter(pl.col("sync_name").is_in(apis)) if trace.has_gpu else None
        what = f"the idle gaps after the synchronous copy/memset calls ({', '.join(map(str, apis))})"
    elif cause is not None and trace.has_gpu:
        g = ctx.gaps.filter(pl.col("cause") == cause)
        if steps:
            g = g.filter(pl.col("step").is_in(steps))
        what = f"the idle gaps of cause '{cause}'" + (f" in steps {steps[0]}-{steps[-1]}" if steps else "")
    else:
        g = None
    if g is not None:
        label = pl.col("cause").cast(pl.String)
        if cause == "sync" or f.id == "sync_copy_apis":
            label = pl.concat_str([label, pl.lit(": "), pl.col("sync_name").fill_null("?")])
        return g.select("device", "start_ns", "end_ns", label.alias("label")), what
    gpu = trace.gpu
    kernels = [k for k in (f.where or {}).get("kernels", []) if isinstance(k, str)]
    if f.category in _KERNEL_CATEGORIES and kernels:
        w = gpu.filter((pl.col("kind") == "kernel") & pl.col("name").is_in(kernels))
        what = f"every launch of the {len(kernels)} kernel(s) it names"
    elif f.category in ("memcpy_bound", "pageable_memcpy"):
        w = gpu.filter(pl.col("kind") == "memcpy")
        if f.category == "pageable_memcpy":
            w = w.filter((pl.col("src_kind") == "Pageable") | (pl.col("dst_kind") == "Pageable"))
        dirs = [d for d in (f.where or {}).get("directions", []) if isinstance(d, str)]
        if dirs:
            w = w.filter(pl.col("copy_kind").cast(pl.String).is_in(dirs))
        what = "the copies it is about" + (f" ({', '.join(dirs)})" if dirs else "")
    elif f.category == "communication_bound":
        w = gpu.filter(pl.col("is_comm"))
        what = "the communication kernels"
    else:
        w = None
    if w is not None and w.height:
        return w.select("device", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
                        pl.col("name").alias("label")), what
    # no narrower signal: its steps (GPU-side windows), else the analysed window
    st = ctx.step_table
    if steps and st.height and "device" in st.columns and st["device"].null_count() == 0:
        s = st.filter(pl.col("step").is_in(steps))
        if s.height:
            return s.select("device", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
                            pl.format("step {}", pl.col("step")).alias("label")), f"the steps it names ({len(steps)})"
    lo, hi = ctx.window
    devs = sorted(ctx.busy) or [0]
    return pl.DataFrame({"device": devs, "start_ns": [lo] * len(devs), "end_ns": [hi] * len(devs),
                         "label": ["analysed window"] * len(devs)}, schema={"device": pl.Int32, "start_ns": pl.Int64,
                         "end_ns": pl.Int64, "label": pl.String}).select(cols), "the analysed window (the finding is about all of it)"


def _finding_events(tracks: _Tracks, findings, ctx) -> list[dict]:
    out = []
    for rank, f in enumerate(findings):
        spans, what = _finding_spans(f, ctx)
        spans = spans.filter(pl.col("end_ns") > pl.col("start_ns")).sort("device", "start_ns")
        dropped = max(spans.height - MAX_SLICES_PER_FINDING, 0)
        if dropped:
            # the longest ones: they are what a reader looks for
            spans = spans.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("_d")).sort("_d", descending=True) \
                .head(MAX_SLICES_PER_FINDING).drop("_d").sort("device", "start_ns")
        d = f.to_dict()
        args = {"finding": f.id, "category": f.category, "severity": f.severity, "title": f.title,
                "est_gain_ms": d["est_gain_ms"], "est_gain_pct": d["est_gain_pct"], "fix": f.fix,
                "evidence": _clean(f.evidence), "where": _clean(f.where), "assumption": f.assumption,
                "marked": what + (f"; the {MAX_SLICES_PER_FINDING} longest of {spans.height + dropped} shown" if dropped else "")}
        name = f"{f.id}: {f.title}"
        for device, part in spans.group_by("device", maintain_order=True):
            dev = device[0]
            s, e = part["start_ns"].to_numpy(), part["end_ns"].to_numpy()
            lanes = _lanes(s, e)
            labels = part["label"].to_list()
            for i in range(part.height):
                tid = rank * 1000 + (0 if dev is None else int(dev)) * 10 + min(int(lanes[i]), 9) + 1
                lane = f", lane {lanes[i] + 1}" if lanes.max() > 0 else ""
                pid, tid = tracks.thread("proflab: findings", tid, f"#{rank + 1} {f.severity} {f.id} (GPU {dev}{lane})")
                a = args if i == 0 else {"finding": f.id, "see": "the first slice of this track holds the evidence, gain and fix"}
                out.append({"ph": "X", "cat": f"proflab.finding.{f.category}", "name": name, "pid": pid, "tid": tid,
                            "ts": _us(s[i]), "dur": _us(e[i] - s[i]), "args": {**a, "here": labels[i]}})
    return out


def _busy_counters(tracks: _Tracks, ctx) -> list[dict]:
    lo, hi = ctx.window
    if hi <= lo or not ctx.busy:
        return []
    bin_ns = max(math.ceil((hi - lo) / BUSY_BINS), _MIN_BIN_NS)
    edges = np.arange(lo, hi, bin_ns, dtype=np.int64)
    ends = np.minimum(edges + bin_ns, hi)
    pid = tracks.pid("proflab: counters")
    out = []
    for dev, busy in sorted(ctx.busy.items()):
        covered = busy.covered_within(edges, ends)
        pct = np.clip(100.0 * covered / np.maximum(ends - edges, 1), 0.0, 100.0)
        name = f"GPU {dev} busy (%)"
        for t, p in zip(edges.tolist(), pct.tolist()):
            out.append({"ph": "C", "cat": "proflab.counter", "name": name, "pid": pid, "tid": 0, "ts": _us(t),
                        "args": {"busy_pct": round(p, 2)}})
        out.append({"ph": "C", "cat": "proflab.counter", "name": name, "pid": pid, "tid": 0, "ts": _us(hi),
                    "args": {"busy_pct": 0.0}})
    return out


def _power_counters(tracks: _Tracks, trace, monitor: Path, notes: list[str]) -> list[dict]:
    """NVML power from ``monitor.parquet``, placed on the trace's clock by its base time."""
    base = trace.meta.base_time_ns
    if base is None:
        notes.append("monitor power not drawn: the trace has no baseTimeNanoseconds to place it on the monitor's clock")
        return []
    from proflab.errors import InputError
    from proflab.readers.monitor import read_monitor

    try:
        m = read_monitor(monitor, columns=["device", "time_ns", "power_w"])
    except InputError as e:  # a damaged monitor file costs the counter, not the export
        notes.append(f"monitor power not drawn: {monitor.name} unreadable ({e.problem})")
        return []
    lo, hi = trace.window_ns
    margin = 1_000_000_000  # a second each side: NVML's power is a one-second average
    m = m.filter(pl.col("power_w").is_not_null() & pl.col("time_ns").is_between(base + lo - margin, base + hi + margin)).sort("device", "time_ns")
    if m.height == 0:
        notes.append("monitor power not drawn: no monitor sample falls within a second of the trace's span")
        return []
    pid = tracks.pid("proflab: counters")
    out = []
    for r in m.iter_rows(named=True):
        ts = (r["time_ns"] - base) / 1000.0
        if ts < 0 or not math.isfinite(r["power_w"]):
            continue
        out.append({"ph": "C", "cat": "proflab.counter", "name": f"NVML GPU {r['device']} power (W)", "pid": pid, "tid": 0,
                    "ts": round(ts, 3), "args": {"power_w": round(float(r["power_w"]), 2)}})
    return out


def _model_events(trace) -> Iterator[bytes]:
    """The model's events as trace events (the faithful subset: what proflab read), as JSON
    fragments (events joined by commas) of ``_MODEL_CHUNK_ROWS`` rows each, written by polars
    from the columns (``_event_json``): an event object per row built in Python cost 4.3 us a
    row, a minute for the 13.8 M events of the 1 GB export."""
    gpu = trace.gpu
    meta: list[dict] = []
    for dev in gpu["device"].drop_nulls().unique().sort().to_list():
        meta.append({"ph": "M", "name": "process_name", "pid": int(dev), "tid": 0, "args": {"name": f"GPU {dev}"}})
    for dev, stream in gpu.select("device", "stream").unique().drop_nulls().sort("device", "stream").iter_rows():
        meta.append({"ph": "M", "name": "thread_name", "pid": int(dev), "tid": int(stream), "args": {"name": f"stream {stream}"}})
    for pid in trace.cpu["pid"].drop_nulls().unique().sort().to_list():
        meta.append({"ph": "M", "name": "process_name", "pid": int(pid), "tid": 0, "args": {"name": f"host process {pid}"}})
    yield _fragment(meta)
    gpu_args = ["correlation", "external_id", "bytes", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                "registers", "shared_mem_bytes", "copy_kind"]
    yield from _event_json(gpu, "kind", "device", "stream", gpu_args)
    yield from _event_json(trace.cpu, "cat", "pid", "tid", ["external_id", "correlation"])


_MODEL_CHUNK_ROWS = 200_000


def _us_array(ns: pl.Series) -> pl.Series:
    """``_us`` for a column: numpy's division is IEEE's, as Python's is, and with ns integers
    ``round`` changes nothing after it (the same as Python on 300 k values up to 2^62; polars'
    division was off in the last digit for 1 value in 7, 156231341.39000002, and its
    ``round(3)`` for timestamps of 4.6e12 us)."""
    return pl.Series(ns.name, ns.cast(pl.Float64).to_numpy() / 1000.0)


def _event_json(frame: pl.DataFrame, cat: str, pid: str, tid: str, args: list[str]) -> Iterator[bytes]:
    """Complete events of ``frame``'s rows: category, name ("?" when it has none), process and
    thread (0 when missing), ts and dur in us, and the non-null ``args``. The rows of a chunk
    are written in groups of the same null args, each with only the args its rows have
    (so the order of events inside a chunk is by group; a viewer orders them by time)."""
    name = pl.col("name")
    event = [
        pl.lit("X").alias("ph"),
        pl.col(cat).cast(pl.String).alias("cat"),
        pl.when(name.is_null() | (name == "")).then(pl.lit("?")).otherwise(name).alias("name"),
        pl.col(pid).cast(pl.Int64).fill_null(0).alias("pid"),
        pl.col(tid).cast(pl.Int64).fill_null(0).alias("tid"),
        pl.col("ts"),
        pl.col("dur"),
    ]
    arg = {a: pl.col(a) if frame.schema[a] == pl.String or frame.schema[a].is_numeric() else pl.col(a).cast(pl.String) for a in args}
    nulls = pl.sum_horizontal(pl.col(a).is_null().cast(pl.UInt32) * (1 << i) for i, a in enumerate(args)).alias("_nulls")
    for first in range(0, frame.height, _MODEL_CHUNK_ROWS):
        part = frame.slice(first, _MODEL_CHUNK_ROWS)
        part = part.with_columns(_us_array(part.get_column("start_ns")).alias("ts"),
                                 _us_array(part.get_column("dur_ns").fill_null(0).clip(lower_bound=0)).alias("dur"), nulls)
        pieces = []
        for (mask,), group in part.partition_by("_nulls", as_dict=True, maintain_order=True).items():
            present = [arg[a] for i, a in enumerate(args) if not (mask >> i) & 1]
            if present:
                pieces.append(_json_rows(group.select(*event, pl.struct(present).alias("args"))))
            else:
                pieces.append(_json_rows(group.select(event), b',"args":{}'))
        text = b",".join(p for p in pieces if p)
        if text:
            yield text


def _original(path: Path, notes: list[str]) -> _Original | None:
    """The Kineto file's top-level fields as raw JSON bytes (``msgspec.Raw``) and its events
    to copy verbatim: checked a slice at a time where the file is in Kineto's layout
    (``_streamed``), else as one document (the events never become Python objects, so that
    copy costs about the file's size in memory). None (and a note) where it cannot be copied."""
    from proflab.readers._kineto_size import json_bytes
    from proflab.readers._slices import XZ_MAGIC
    from proflab.readers.kineto import read_bytes

    size = path.stat().st_size
    raw_size = size
    with open(path, "rb") as fh:
        magic = fh.read(len(XZ_MAGIC))
        gz, xz = magic[:2] == b"\x1f\x8b", magic == XZ_MAGIC
        if gz and size >= 4:
            fh.seek(-4, 2)
            raw_size = max(int.from_bytes(fh.read(4), "little"), size)  # gzip's ISIZE: the size mod 4 GiB
    if xz:
        raw_size = max(json_bytes(path)[0], size)
    if raw_size > MAX_PASSTHROUGH_BYTES:
        notes.append(f"the input holds {raw_size / 2**20:.0f} MiB of JSON, over {MAX_PASSTHROUGH_BYTES // 2**20} MiB: its events are "
                     "written as proflab read them (kernels, copies, sets, operators, annotations, Python frames, runtime "
                     "calls with their ids), not verbatim")
        return None
    streamed = _streamed(path)
    if streamed is not None:
        return streamed
    data = read_bytes(path)  # (the reader's: gunzipped or unxz'd)
    bare = data[:4096].lstrip()[:1] == b"["
    try:
        doc = msgspec.json.decode(data, type=msgspec.Raw if bare else dict[str, msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError):
        doc = None
    if isinstance(doc, msgspec.Raw):  # the bare-array form: events only
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), msgspec.Raw) or \
            not bytes(memoryview(doc["traceEvents"])[:64]).lstrip().startswith(b"["):
        notes.append("the input is not strict JSON with a traceEvents list (proflab read it tolerantly): its events are "
                     "written as proflab read them, not verbatim")
        return None
    why = _unsound(doc["traceEvents"])
    if why:
        notes.append(f"the input has events a viewer would reject ({why}): its events are written as proflab read them, "
                     "not verbatim")
        return None
    raw = doc.pop("traceEvents")
    return _Original(doc, lambda: iter(() if (body := _inside(memoryview(raw))) is None else (body,)))


class _Original(NamedTuple):
    """The input's top-level fields but its events, and the inside of its events array (what
    lies between the brackets, verbatim) as chunks of bytes."""

    fields: dict[str, msgspec.Raw]
    events: Callable[[], Iterator[bytes | memoryview]]


_COPY_BYTES = 16 << 20


def _streamed(path: Path) -> _Original | None:
    """The original a slice at a time (Kineto's layout, as the reader slices it): each slice's
    events checked as ``_unsound`` checks them, then only the document around the events kept,
    and the events copied from the file (or its gzip or xz stream) when written. The whole document
    and a struct per event held at once cost the 514 MB trace 1,169 MiB. None where the file is
    not in that layout or an event fails a check: the whole-document path then says why."""
    from proflab.errors import InputError
    from proflab.readers._slices import NotSliceable, byte_chunks, open_slicer

    try:
        slicer = open_slicer(path, _COPY_BYTES)
    except InputError:
        return None
    try:
        for piece in slicer.pieces():
            try:
                ok = _unsound(piece) is None
            finally:
                slicer.done(piece)
            if not ok:
                return None
        head, tail, size = slicer.head or b"", slicer.tail or b"", slicer.size
        fields = msgspec.json.decode(slicer.document(), type=dict[str, msgspec.Raw])
    except (NotSliceable, InputError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    finally:
        slicer.close()
    if bytes(fields.pop("traceEvents", b"")).strip() != b"[]":
        return None
    lo, hi = len(head) + 1, size - len(tail) - 1  # the events array's inside: after '[', before ']'

    def events() -> Iterator[bytes]:
        at = 0
        for chunk in byte_chunks(path):
            end = at + len(chunk)
            if end > lo and at < hi:
                yield chunk[max(lo - at, 0) : min(hi, end) - at]
            at = end
            if at >= hi:
                return

    return _Original(fields, events)


_PHASES = ("B", "E", "X", "i", "I", "b", "n", "e", "S", "T", "p", "F", "s", "t", "f", "P", "O", "N", "D", "C", "M", "R",
           "c", "(", ")", "v", "V")
_NonNeg = Annotated[float, msgspec.Meta(ge=0)]


class _Ev(msgspec.Struct):
    """The fields of an event a viewer checks (args stay raw bytes)."""

    ph: Literal[_PHASES]  # type: ignore[valid-type]
    ts: _NonNeg | None = None
    dur: _NonNeg | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: msgspec.Raw = msgspec.Raw(b"null")


def _unsound(raw) -> str | None:
    """Why the input's events are not all valid Trace Event Format, or None. Decoded into
    slim structs (the types are checked by the decoder), never into dicts."""
    try:
        events = msgspec.json.decode(raw, type=list[_Ev])
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        return str(e)
    for i, e in enumerate(events):
        ph = e.ph
        if ph == "X":
            if e.dur is None or e.ts is None or not math.isfinite(e.dur + e.ts):
                return f"event {i}: complete event without a finite ts and dur"
        elif ph == "M":
            continue
        elif e.ts is None or not math.isfinite(e.ts):
            return f"event {i}: ts {e.ts!r}"
        elif ph == "C":
            a = msgspec.json.decode(e.args)
            if not isinstance(a, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in a.values()):
                return f"event {i}: counter with non-numeric args"
    return None


def _our_pid_base(trace) -> int:
    """A pid range no input process uses: above Linux's largest pid (2^22) and every pid
    and device the trace holds."""
    seen = [2**22]
    for col, df in (("pid", trace.cpu), ("device", trace.gpu)):
        v = df[col].max() if df.height else None
        if v is not None:
            seen.append(int(v))
    return max(seen) + 1000


def _added(tracks: _Tracks, trace, report, ctx) -> Iterator[bytes]:
    """Our events but the power counters (see module doc), as JSON fragments when they are
    written; ``tracks.meta`` names their tracks once all are made."""
    if trace.has_gpu:
        ctx.free_device_levels()  # (before the gaps: their temporaries never beside the levels)
        yield from _gap_events(tracks, ctx.gaps)
        yield _fragment(_busy_counters(tracks, ctx))
        st = ctx.step_table
        if st.height:
            yield _fragment(_step_events(tracks, st))
    yield _fragment(_finding_events(tracks, report.findings, ctx))


def _fragment(events: list[dict]) -> bytes:
    """Events as a JSON fragment: joined by commas, no brackets."""
    return _dumps(events)[1:-1]


def _enc_hook(obj):
    if isinstance(obj, np.generic):  # numpy scalars in a finding's figures
        return obj.item()
    raise NotImplementedError(f"cannot write a {type(obj).__name__} into the trace")


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)


def _dumps(obj) -> bytes:
    return _ENCODER.encode(obj)


_WS = b" \t\r\n"


def _inside(mv: memoryview) -> memoryview | None:
    """What lies between a JSON array's brackets (None when it is empty)."""
    i, j = 0, len(mv) - 1
    while mv[i] in _WS:
        i += 1
    while mv[j] in _WS:
        j -= 1
    k = i + 1
    while k < j and mv[k] in _WS:
        k += 1
    return None if k >= j else mv[i + 1 : j]


def _write_doc(fh, original: _Original | None, model_events: Iterable[bytes], ours: Iterable[bytes],
               tracks: _Tracks, other: dict) -> None:
    """``{...the input's other fields, "otherData": ..., "traceEvents": [input's or the
    model's, ours, our tracks' names]}``, written piece by piece: event chunks as they are
    made (the names of our tracks last, once every event has taken its track)."""

    fh.write(b"{")
    fields = original.fields if original is not None else {}
    for key, raw in fields.items():
        if key in ("traceEvents", "otherData"):
            continue
        fh.write(_dumps(key) + b":")
        fh.write(memoryview(raw))
        fh.write(b",")
    if "otherData" in fields:
        try:
            prior = msgspec.json.decode(bytes(fields["otherData"]))
        except msgspec.DecodeError:
            prior = None
        if isinstance(prior, dict):
            other = {**prior, **other}
    if "displayTimeUnit" not in fields:
        fh.write(b'"displayTimeUnit":"ms",')
    fh.write(b'"otherData":' + _dumps(other) + b',"traceEvents":[')
    first = True
    if original is not None:
        for body in original.events():  # the array's inside, verbatim
            if len(body):
                fh.write(body)
                first = False
    names = (_fragment(meta) for meta in [tracks.meta])  # (made once every event has its track)
    for chunk in itertools.chain(model_events, ours, names):  # (a chunk's events at a time: the bytes stay small)
        if chunk:
            fh.write(chunk if first else b"," + chunk)
            first = False
    fh.write(b"]}")


def write_perfetto(trace, report, out: str | Path, *, ctx=None, monitor: str | Path | None = None,
                   keep_original: bool = True) -> Path:
    """Write the marked trace to ``out`` (atomically; gzip when it ends ``.gz``, xz when ``.xz``); see the
    module doc. ``keep_original``: copy a Kineto file's own events (when it is strict JSON of
    at most ``MAX_PASSTHROUGH_BYTES``); otherwise, or for other inputs, the model's events.
    ``monitor``: a ``monitor.parquet`` whose power samples become counters. Refuses to
    overwrite the input trace."""
    from proflab.analysis import Context

    out = Path(out)
    src = Path(trace.meta.source)
    if out.exists() and src.exists() and out.resolve() == src.resolve():
        raise UsageError(f"{out}: refusing to overwrite the input trace")
    ctx = ctx or Context(trace)
    notes: list[str] = []
    original = None
    if keep_original and trace.meta.format == "kineto" and src.is_file():
        original = _original(src, notes)
    elif keep_original and trace.meta.format == "kineto":
        notes.append("the input file is not at hand: its events are written as proflab read them, not verbatim")
    model_events = [] if original is not None else _model_events(trace)
    if original is None and not notes:
        notes.append("the events are written as proflab read them (kernels, copies, sets, operators, annotations, "
                     "Python frames, runtime calls with their ids), not verbatim from the input")
    tracks = _Tracks(_our_pid_base(trace))
    # (the power counters first: what they note goes in otherData, written before any event)
    power = _power_counters(tracks, trace, Path(monitor), notes) if monitor is not None and Path(monitor).is_file() else []
    ours = itertools.chain(_added(tracks, trace, report, ctx), [_fragment(power)])
    other = {"proflab": {"events": "original" if original is not None else "model", "notes": notes,
                         "findings": [f.id for f in report.findings], "source": src.name}}
    with atomic_path(out) as tmp:
        with _opened(tmp, out.name) as fh:
            _write_doc(fh, original, model_events, ours, tracks, other)
    return out


def _opened(path: Path, name: str):
    """``path`` opened for writing: gzip when ``name`` ends ``.gz``, xz when ``.xz``, else
    plain. xz at preset 1: a 27 MB trace in 0.25 s to 1.23 MB, where gzip's level 3 takes
    0.06 s to 2.01 MB and xz's default (6) 4.1 s to 1.14 MB."""
    if name.endswith(".gz"):
        return gzip.open(path, "wb", compresslevel=3)
    if name.endswith(".xz"):
        import lzma

        return lzma.open(path, "wb", preset=1)
    return open(path, "wb")
