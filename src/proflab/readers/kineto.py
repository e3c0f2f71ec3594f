"""Reader for torch.profiler / Kineto Chrome-trace JSON (PyTorch 1.8 to current; CUDA and ROCm).

Accepts ``export_chrome_trace`` output and ``tensorboard_trace_handler`` files
(``*.pt.trace.json``), plain or gzip-compressed. The JSON is decoded by msgspec straight
into slim typed structs holding only the fields proflab uses (the decoder is the cost that
matters on large traces), a slice of events at a time (``_slices``), and each slice is
turned into columns at once, so decoded objects never outnumber one slice.

Timestamps are microseconds (float) in the file whatever ``displayTimeUnit`` says (it only
sets how a viewer displays them); the model holds integer nanoseconds.

Decoding is tolerant per field: a slice whose strict decode fails on a value of an unexpected
type is decoded again loosely (``_tolerant``), the value is coerced or dropped for that event,
and the trace's notes say what was done. Only a file that is not a trace is refused.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import polars as pl
from msgspec import Struct, field

from proflab._heap import slices_reused
from proflab._timings import phase
from proflab.errors import (
    CorruptInput,
    EmptyTrace,
    TruncatedInput,
    UnsupportedFormat,
    UsageError,
)
from proflab.model.trace import (
    COMM_SCHEMA,
    CPU_SCHEMA,
    DEVICE_SCHEMA,
    GPU_SCHEMA,
    NextWork,
    Trace,
    TraceMeta,
    steps_from_annotations,
)
from proflab.model.slicing import SliceSpec
from proflab.readers import _progress as progress
from proflab.readers import _tolerant
from proflab.readers._kineto_tables import (
    _comm_table,
    _CPU_CATS,
    cpu_columns,
    _dims,
    _dtypes,
    _Event,
    _external_ids,
    _FLOW_CATS,
    frame_columns,
    _GPU_CATS,
    gpu_columns,
    _ints,
    _KNOWN_CATS,
    name_facts,
    _ns,
    _OP_CATS,
    shape_ops,
    _Tables,
    _timed,
)
from proflab.readers._kineto_size import HELPER_FROM_SLICES, SLICE_BYTES, WIDE_FROM_BYTES, helper_allowed, json_bytes
from proflab.readers._merge import merge_by_start
from proflab.readers._slices import (
    GZIP_MAGIC,
    XZ_MAGIC,
    MappedSlicer,
    NotSliceable,
    Slicer,
    byte_chunks,
    claim,
    open_slicer,
)

__all__ = ["sniff", "read", "read_bytes"]

# Activity of accelerators other than NVIDIA and AMD GPUs (Kineto's activity type names).
_OTHER_ACCEL_CATS = {
    "mtia_runtime": "MTIA",
    "mtia_ccp_events": "MTIA",
    "mtia_insight": "MTIA",
    "glow_runtime": "Glow",
    "hpu_op": "HPU",
    "xpu_runtime": "Intel XPU",
    "xpu_driver": "Intel XPU",
    "privateuse1_runtime": "a PrivateUse1 backend",
    "privateuse1_driver": "a PrivateUse1 backend",
}


class _DocFields(Struct, gc=False, kw_only=True):
    """The document around the events. Its fields are few and small, so they are decoded as
    any JSON value and checked in Python (``_meta``): a document field of an unexpected type
    never costs the trace."""

    schemaVersion: Any = None
    deviceProperties: Any = None
    computeProperties: Any = None  # PyTorch 1.8's name for deviceProperties
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    with_stack: Any = None
    record_shapes: Any = None
    profile_memory: Any = None
    cuda_driver_version: Any = None
    cuda_runtime_version: Any = None
    cupti_version: Any = None
    roctracer_version: Any = None
    hip_runtime_version: Any = None


class _Doc(_DocFields, gc=False, kw_only=True):
    traceEvents: list[_Event]


class _LooseDoc(_DocFields, gc=False, kw_only=True):
    traceEvents: list[_tolerant.LooseEvent]


_DECODER = msgspec.json.Decoder(_Doc | list[_Event])
_LOOSE_DECODER = msgspec.json.Decoder(_LooseDoc | list[_tolerant.LooseEvent])


def sniff(path: Path) -> bool:
    """True when the file looks like JSON (plain, gzip or xz): Kineto is then the reader to try."""
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
    elif head.startswith(XZ_MAGIC):
        import lzma

        try:
            head = lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(head, 256)
        except lzma.LZMAError:
            return True  # as for gzip
    return head.lstrip()[:1] in (b"{", b"[") or head.strip() == b""


def read_bytes(path: Path) -> bytes:
    """The file's JSON bytes, decompressed when gzip or xz; truncation and corruption raise."""
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


def read(path: str | Path, part: SliceSpec | None = None, *, budget: int | None = None) -> Trace:
    """Read a Kineto trace into the model. Raises an InputError subclass on bad input.

    ``part`` (``--steps`` / ``--window``) or ``budget`` (bytes: a trace whose whole analysis
    is estimated to need more is read in a part that fits, ``readers.budget``): the trace's
    slices are decoded to Arrow files on disk as they come, and only the part is read back,
    so memory follows the part, not the trace (``_read_spilled``)."""
    with _no_gc():
        try:
            if part is None and budget is None:
                return _read(Path(path))
            return _read_spilled(Path(path), part, budget)
        except UnicodeDecodeError as e:
            # msgspec raises this, not a DecodeError, for a string that is not UTF-8
            raise CorruptInput(path, f"JSON with text that is not valid UTF-8 (byte 0x{e.object[e.start]:02x})") from None


def _read(path: Path) -> Trace:
    try:
        doc, tables, size = _read_sliced(path)
    except (NotSliceable, msgspec.DecodeError):
        # No events array to cut (not JSON, or not a trace), or a slice that is not valid
        # JSON: decode the whole document, which pins errors to their exact place.
        data = read_bytes(path)
        if not data or data.isspace():
            raise EmptyTrace(path, "file is empty") from None
        size = len(data)
        doc, problems = _decode(path, data)
        del data
        if isinstance(doc, list):  # the Chrome "JSON array" form: events only
            doc = _Doc(traceEvents=doc)
        tables = [_tables(doc.traceEvents, problems)]
        doc.traceEvents = []
    with phase("tables"):  # (the slices' tables, decoded, merged into the trace's)
        event_count, problems, unknown = _tallies(path, tables)
        gpu_parts, cpu_parts = [t.gpu for t in tables], [t.cpu for t in tables]
        comm_parts = [t.comms for t in tables if t.comms is not None and t.comms.height]
        tables.clear()  # the parts are now only in these lists, which the merge empties
        gpu = merge_by_start(gpu_parts)
        cpu = merge_by_start(cpu_parts)
        comms = pl.concat(comm_parts).sort("start_ns") if comm_parts else pl.DataFrame(schema=COMM_SCHEMA)
        devices, meta = _described(path, doc, gpu.height, cpu.height, unknown, problems, size, event_count)
        return Trace(gpu=gpu, cpu=cpu, steps=steps_from_annotations(cpu), devices=devices, meta=meta, comms=comms)


def _tallies(path: Path, tables: list[_Tables]) -> tuple[int, Counter, Counter]:
    """The events, tolerant-decoding problems and unrecognised categories of all slices.
    Raises when there is no event."""
    event_count = sum(t.events for t in tables)
    problems: Counter = Counter()
    for t in tables:
        problems.update(t.problems)
    if event_count == 0:
        if problems:
            raise UnsupportedFormat(path, "JSON, but not a profiler trace: its items are not trace events")
        raise EmptyTrace(path, "trace has no events (traceEvents is empty)")
    unknown: Counter[str] = Counter()
    for t in tables:
        unknown.update(t.unknown)
    return event_count, problems, unknown


def _described(path: Path, doc: _Doc, n_gpu: int, n_cpu: int, unknown: Counter, problems: Counter, size: int,
               event_count: int) -> tuple[pl.DataFrame, TraceMeta]:
    """The devices and meta of a trace of ``n_gpu`` GPU and ``n_cpu`` host events. Raises
    when it has neither."""
    if n_gpu == 0 and n_cpu == 0:
        if unknown:
            found = ", ".join(f"{c!r} ({n})" for c, n in unknown.most_common(5))
            raise UnsupportedFormat(path, f"no torch.profiler/Kineto events; the event categories found are {found}")
        raise EmptyTrace(path, "trace holds no host or GPU events (only metadata)")
    meta_fields, meta_problems = _meta(doc)
    devices = _devices(doc, meta_problems)
    notes: list[str] = _holds(n_gpu, unknown)
    if unknown:
        listed = ", ".join(f"{c!r} ({n})" for c, n in unknown.most_common(5))
        notes.append(f"ignored {sum(unknown.values())} events of unrecognised categories: {listed}")
    notes.extend(_tolerant.notes(problems + meta_problems))
    meta = TraceMeta(
        source=str(path),
        format="kineto",
        size_bytes=size,
        event_count=event_count,
        notes=tuple(notes),
        **meta_fields,
    )
    return devices, meta


def _read_spilled(path: Path, part: SliceSpec | None, budget: int | None) -> Trace:
    """A part of the trace (``part``, or for ``budget`` the middle stretch that fits it,
    ``readers.budget``) in memory that follows the part: each slice's tables go to Arrow
    files in a temporary folder as they are decoded (the helper process's too), the whole
    trace's first event, steps and event count are read from those files, and only the
    part's rows are read back, filtered as they are scanned, then put in time order as a
    whole read orders them. A trace with no events array to cut is decoded whole, as ever."""
    from proflab.readers import budget as limits

    with _on_disk(path, budget) as disk:
        if disk is None:
            return _read_whole_instead(path, part, budget)
        plan = None
        if part is None:
            need = disk.need()
            if need <= budget:  # its size misled the estimate: the whole read fits after all
                return _read(path)
            plan = limits.choose(disk.sample, disk.weights(), need=need, budget=budget, fixed=limits.KINETO_PART_FIXED,
                                 steps=disk.steps, margin=limits.KINETO_PART_MARGIN)
            part = plan.part(disk.origin)
        trace = disk.part(part)
        if plan is None:
            return trace
        like = limits.kernel_likeness(*_kernel_and_copy_time(disk.gpu, plan.lo_ns, plan.hi_ns))
        notes = limits.notes(path.name, plan, trace.gpu.height + trace.cpu.height, disk.whole.meta.event_count, like,
                             what_whole="trace", estimated="from their count", steps=disk.steps)
        return limits.noted(trace, notes, budget)


def read_parts(path: str | Path, budget: int) -> Iterator[Trace]:
    """Every event of the trace in consecutive parts that each fit ``budget`` (the whole
    trace, once, where its whole read fits): decoded to disk once, as for a part
    (``_read_spilled``), and each part read back in turn (``readers.budget.cuts``)."""
    from proflab.readers import budget as limits

    path = Path(path)
    try:
        with _on_disk(path, budget) as disk:
            if disk is None:
                yield _read_whole_instead(path, None, budget)
                return
            need = disk.need()
            if need <= budget:
                with _no_gc():
                    whole = _read(path)
                yield whole
                return
            specs = limits.cuts(disk.sample, disk.weights(), budget=budget, fixed=limits.KINETO_PART_FIXED, steps=disk.steps,
                                origin=disk.origin, margin=limits.KINETO_PART_MARGIN, calls=disk.calls)
            if cuts := limits.cut_times(specs, disk.origin, disk.steps):
                specs = limits.by_launch(specs, *disk.latest_launches(cuts))
            yield from limits.each_part(specs, disk.next_work(specs), disk.part, budget,
                                        EmptyTrace(path, "trace holds no host or GPU events in any of its parts"))
    except UnicodeDecodeError as e:
        raise CorruptInput(path, f"JSON with text that is not valid UTF-8 (byte 0x{e.object[e.start]:02x})") from None


class _OnDisk:
    """A trace decoded to Arrow files (``_on_disk``): the whole trace's description with no
    rows (``whole``), lazy scans of its GPU and host rows, its steps, first event and a
    sample of its events' starts."""

    def __init__(self, path: Path, whole: Trace, gpu: pl.LazyFrame, cpu: pl.LazyFrame, origin: int | None, sample: np.ndarray,
                 calls: np.ndarray, decoded: int) -> None:
        self.path, self.whole, self.gpu, self.cpu, self.origin, self.sample = path, whole, gpu, cpu, origin, sample
        self.calls = calls  # starts of a sample of the runtime calls (``budget.cuts``)
        self.steps = whole.steps
        self.decoded = decoded  # GPU and host events kept (the event count also counts metadata)

    def need(self) -> int:
        from proflab.readers import budget as limits

        return limits.kineto_need(self.path, self.decoded)

    def weights(self) -> np.ndarray:
        """Bytes of a part's read and analysis each sampled start stands for."""
        from proflab.readers import budget as limits

        return np.full(self.sample.size, limits.KINETO_PART_EVENT * self.decoded / max(self.sample.size, 1))

    def latest_launches(self, times: list[int]) -> tuple[list[dict[int, int]], set[int]]:
        """Per cut time (ns), per process (``correlation >> 32``), the highest correlation
        id of host calls starting before it; and the processes with any
        (``readers.budget.by_launch``): one streaming scan of the decoded host rows."""
        c = pl.col("correlation")
        got = (
            self.cpu.filter(c.is_not_null())
            .group_by((c // (1 << 32)).alias("key"))
            .agg(*(c.filter(pl.col("start_ns") < t).max().alias(f"before_{i}") for i, t in enumerate(times)))
            .collect(engine="streaming")
        )
        keys = got["key"].to_list()
        latest = [{k: v for k, v in zip(keys, got[f"before_{i}"].to_list(), strict=True) if v is not None} for i in range(len(times))]
        return latest, set(keys)

    def next_work(self, specs: list[SliceSpec]) -> list[tuple[NextWork, ...]]:
        """For each part but the last of the trace analysed in parts, per device, the next
        part's first GPU work and its launch (``TraceMeta.next_part_work``): one streaming
        scan of the decoded GPU rows for each part's first work per device (by its
        correlation ids), then those works' launch calls."""
        from proflab.model.slicing import launched_by

        c, t = pl.col("correlation"), pl.col("start_ns")
        if len(specs) < 2 or any(not s.correlations for s in specs[1:]):
            return [() for _ in specs[1:]]
        conds = [launched_by(s.correlations) for s in specs[1:]]
        which = pl.when(conds[0]).then(0)
        for i, cond in enumerate(conds[1:], 1):
            which = which.when(cond).then(i)
        first = (
            self.gpu.select("device", "start_ns", "correlation", which.otherwise(None).alias("i"))
            .filter(pl.col("i").is_not_null() & pl.col("device").is_not_null())
            .group_by("i", "device")
            .agg(pl.all().sort_by("start_ns").first())
            .collect(engine="streaming")
            .sort("i", "device")
        )
        calls = (
            self.cpu.filter(c.is_in(first["correlation"].drop_nulls().implode()))
            .select("correlation", "name", "start_ns", (t + pl.col("dur_ns")).alias("end_ns"), "tid")
            .collect(engine="streaming")
            .unique("correlation", keep="first")
        )
        got = first.join(calls, on="correlation", how="left", suffix="_call")
        out: list[list[NextWork]] = [[] for _ in conds]
        for r in got.iter_rows(named=True):
            out[r["i"]].append(NextWork(int(r["device"]), int(r["start_ns"]), r["start_ns_call"], r["end_ns"], r["tid"], r["name"]))
        return [tuple(w) for w in out]

    def part(self, part: SliceSpec) -> Trace:
        from proflab.model.slicing import slice_frames, with_frames

        g, c, st, note, ahead = slice_frames(self.gpu, self.cpu, self.steps.lazy(), part, str(self.path), origin_ns=self.origin,
                                             all_steps=self.steps)
        g, c = _in_time_order(g.collect(engine="streaming")), _in_time_order(c.collect(engine="streaming"))
        return with_frames(self.whole, g, c, st.collect(), note, None if ahead is None else _in_time_order(ahead.collect(engine="streaming")))


@contextmanager
def _on_disk(path: Path, budget: int | None):
    """The trace's slices decoded to Arrow files in a temporary folder (removed on exit), as
    an ``_OnDisk``; None for a trace with no events array to cut (``_slices``)."""
    from proflab.readers import budget as limits

    with tempfile.TemporaryDirectory(prefix="proflab-part-") as tmp:
        spill = Path(tmp)
        try:
            # the helper process while decoding: only where the budget holds both processes
            with _no_gc():
                doc, tables, size = _read_sliced(path, spill, helper=budget is None or budget >= limits.KINETO_PART_FIXED + limits.KINETO_HELPER)
        except _NoRoom as e:
            raise UsageError(f"{path}: cannot decode it to disk in {tmp} ({e}): reading a part of it needs about "
                             f"{limits.size_text(0.4 * path.stat().st_size)} free there; set TMPDIR to a folder with room, or read it "
                             "whole (--memory-budget none)") from None
        except (NotSliceable, msgspec.DecodeError):
            yield None
            return
        event_count, problems, unknown = _tallies(path, tables)
        comm_parts = [t.comms for t in tables if t.comms is not None and t.comms.height]
        comms = pl.concat(comm_parts).sort("start_ns") if comm_parts else pl.DataFrame(schema=COMM_SCHEMA)
        n = len(tables)
        del tables
        files = {t: [spill / f"{t}-{i}.arrow" for i in range(n)] for t in ("gpu", "cpu")}
        n_gpu, n_cpu, origin, marked, sample, calls = _spilled_facts(files, every=max(1, event_count // 65_536))
        devices, meta = _described(path, doc, n_gpu, n_cpu, unknown, problems, size, event_count)
        # each row's place in the whole read's order: its start before any clipping, then its
        # slice and row (the scans keep both)
        gpu, cpu = (pl.scan_ipc(files[t]).with_columns(pl.col("start_ns").alias("_order")) for t in ("gpu", "cpu"))
        whole = Trace(gpu=pl.DataFrame(schema=GPU_SCHEMA), cpu=pl.DataFrame(schema=CPU_SCHEMA), steps=steps_from_annotations(marked),
                      devices=devices, meta=meta, comms=comms)
        yield _OnDisk(path, whole, gpu, cpu, origin, sample, calls, n_gpu + n_cpu)


def _read_whole_instead(path: Path, part: SliceSpec | None, budget: int | None) -> Trace:
    """A trace that cannot be cut into slices (no events array its structure shows, so no
    slices to read a part from): decoded whole, as ever (which also pins a broken document's
    error to its place), then cut to ``part``; read for a ``budget``, it says the budget was
    not held."""
    from proflab.model.slicing import slice_trace
    from proflab.readers import budget as limits

    trace = slice_trace(_read(path), part)
    if part is not None or budget is None:
        return trace
    said = (f"memory budget: {path.name} holds no traceEvents array its structure could be cut at (a part is read from "
            f"its slices), so it was read whole ({trace.meta.event_count:,} events) over the budget of {limits.size_text(budget)}")
    return limits.noted(trace, [said])


def _spilled_facts(files: dict[str, list[Path]], every: int) -> tuple[int, int, int | None, pl.DataFrame, np.ndarray, np.ndarray]:
    """What the whole trace's decoded slices say, read a file and a few columns at a time
    (a scan of them all at once held a third of the trace): its GPU and host event counts,
    first start, the host rows that may be profiler steps (in the whole read's order), the
    starts of every ``every``-th event, and of every ``every``-th runtime call."""
    n_gpu = n_cpu = 0
    firsts, marked, sample, calls = [], [], [], []
    for kind in ("gpu", "cpu"):
        for f in files[kind]:
            df = pl.read_ipc(f, columns=["cat", "name", "start_ns", "dur_ns"] if kind == "cpu" else ["start_ns"])
            if kind == "gpu":
                n_gpu += df.height
            else:
                n_cpu += df.height
                marked.append(df.filter(pl.col("name").str.starts_with("ProfilerStep#")))
                calls.append(df.filter(pl.col("cat").is_in(["cuda_runtime", "cuda_driver"]))["start_ns"].drop_nulls()
                             .gather_every(max(1, every // 4)).to_numpy())
            starts = df.get_column("start_ns").drop_nulls()
            if starts.len():
                firsts.append(int(starts.min()))
                sample.append(starts.gather_every(every).to_numpy())
    steps = pl.concat(marked) if marked else pl.DataFrame(schema={c: CPU_SCHEMA[c] for c in ("cat", "name", "start_ns", "dur_ns")})
    return (n_gpu, n_cpu, min(firsts) if firsts else None, steps.sort("start_ns", maintain_order=True),
            np.concatenate(sample) if sample else np.empty(0, dtype=np.int64),
            np.concatenate(calls) if calls else np.empty(0, dtype=np.int64))


def _in_time_order(df: pl.DataFrame) -> pl.DataFrame:
    """Rows read back from the decoded slices (in their order, each with its start before any
    clipping as ``_order``) in the order a whole read gives them: by that start, ties in
    slice order, merged as the whole read merges its slices (text through one small
    dictionary, not a copy per row)."""
    schema = [c for c in df.columns if c != "_order"]
    merged = merge_by_start([df.rename({"start_ns": "_clipped"}).rename({"_order": "start_ns"})])
    return merged.with_columns(pl.col("_clipped").alias("start_ns")).select(schema)


def _kernel_and_copy_time(gpu: pl.LazyFrame, lo: int, hi: int) -> tuple[list[tuple], tuple[int, int]]:
    """(kernel name, its time in the whole trace, its time inside [lo, hi)) in ns, and the
    copies' time in the whole and inside (``budget.kernel_likeness`` takes both), over the
    trace's decoded slices as they are scanned."""
    end = pl.col("start_ns") + pl.col("dur_ns")
    inside = (pl.min_horizontal(end, pl.lit(hi)) - pl.max_horizontal(pl.col("start_ns"), pl.lit(lo))).clip(lower_bound=0)
    got = (gpu.filter(pl.col("kind").is_in(["kernel", "memcpy"])).group_by("kind", "name")
           .agg(pl.col("dur_ns").sum().alias("whole"), inside.sum().alias("part")).collect(engine="streaming"))
    kernels = got.filter(pl.col("kind") == "kernel").drop("kind")
    copies = got.filter(pl.col("kind") == "memcpy").select(pl.col("whole", "part").sum()).row(0)
    return list(kernels.iter_rows()), copies


def _holds(gpu: int, unknown: Counter) -> list[str]:
    """A first note saying what the trace holds when it is not a GPU trace proflab diagnoses.
    ``gpu``: how many GPU activities it has."""
    accel = sorted({_OTHER_ACCEL_CATS[c] for c in unknown if c in _OTHER_ACCEL_CATS})
    if accel and gpu == 0:
        return [
            f"the trace holds host events and activity of {', '.join(accel)}, which proflab does not diagnose: "
            "only host-side findings (operators, steps, Python) are given"
        ]
    if accel:
        return [f"the trace also holds activity of {', '.join(accel)}, which is not analysed"]
    if gpu == 0:
        return [
            "the trace holds host events only (a CPU-only profile, or GPU activity was not recorded): "
            "GPU time, idle gaps, kernels and copies cannot be diagnosed from it"
        ]
    return []


def _tables(events: list, problems: Counter | None = None) -> _Tables:
    """Columns for one batch of decoded events; the structs can be freed right after."""
    gpu_evs, frames, ops, rest = _partition(events)
    counts = Counter(rest)  # the categories of every event that is not an operator, GPU activity or frame
    unknown = Counter({c: n for c, n in counts.items() if c not in _KNOWN_CATS})
    problems = problems if problems is not None else Counter()
    gpu, cpu_ops = _gpu_table(gpu_evs), _cpu_table(ops)
    if gpu.height and gpu.get_column("correlation").null_count() and counts.keys() & _FLOW_CATS:
        gpu, cpu_ops = _link_by_flows(events, gpu_evs, gpu, ops, cpu_ops)
    cpu = pl.concat([cpu_ops, _frame_table(frames)]) if frames else cpu_ops
    # the collectives by name among the operators' names (a test of every operator in Python
    # cost 5 % of a slice)
    calls = cpu_ops.get_column("name").eq("record_param_comms").arg_true().to_list() if cpu_ops.height else []
    comms = _comm_table([e for e in map(ops.__getitem__, calls) if e.args.collective is not None])
    gpu, cpu, comms = _timed(gpu, problems), _timed(cpu, problems), _timed(comms, None)
    return _Tables(gpu, cpu, unknown, len(events), problems, comms)


def _partition(events: list) -> tuple[list, list, list, list[str]]:
    """GPU activity, Python frames and host operators (both complete events, ph "X"), each
    in file order, and the categories of all other events, in one pass (three filtering
    passes cost 1.6x as much, and indices from a polars column of the categories 1.9x: 24
    and 28 ms against 15 ms a slice; counting every event's category apart, 10 ms more)."""
    gpu: list = []
    frames: list = []
    ops: list = []
    rest: list[str] = []
    add_gpu, add_frame, add_op, add_rest = gpu.append, frames.append, ops.append, rest.append
    for e in events:
        c = e.cat
        if c in _OP_CATS:
            if e.ph == "X":
                add_op(e)
        elif c in _GPU_CATS:
            add_gpu(e)
        elif c == "python_function":
            if e.ph == "X":
                add_frame(e)
        else:
            add_rest(c)
    return gpu, frames, ops, rest




def _link_by_flows(events: list, gpu_evs: list, gpu: pl.DataFrame, ops: list, cpu: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Correlation ids from the launch flows, for traces whose kernels carry none (some ROCm
    traces keep only the flow): Kineto starts a flow (ph "s") where the runtime
    call starts and ends it (ph "f") where the kernel starts, with the correlation id as the
    flow id. Only runs when some GPU activity lacks a correlation id."""
    ends: dict[tuple, int] = {}
    for e in events:
        if e.cat in _FLOW_CATS and type(e.id) is int and e.ph in ("s", "f"):
            ends[e.ph, e.pid, e.tid, e.ts] = e.id
    if not ends:
        return gpu, cpu
    got = ends.get
    gpu = gpu.with_columns(
        pl.col("correlation").fill_null(pl.Series([got(("f", e.pid, e.tid, e.ts)) for e in gpu_evs], dtype=pl.Int64))
    )
    launch = ("cuda_runtime", "Runtime", "hip_runtime", "cuda_driver", "Driver", "hip_driver")
    cpu = cpu.with_columns(
        pl.col("correlation").fill_null(
            pl.Series([got(("s", e.pid, e.tid, e.ts)) if e.cat in launch else None for e in ops], dtype=pl.Int64)
        )
    )
    return gpu, cpu


_CHUNK_BYTES = SLICE_BYTES  # (why 16 MiB: ``_kineto_size``)
_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])


def _slice_tables(payload: bytes | bytearray | memoryview) -> _Tables:
    """Tables for one slice: a JSON array of events (see ``_slices``). The strict typed
    decode is the fast path (the compiled decoder before it, where built); a slice it
    refuses for a value's type is decoded tolerantly."""
    from proflab.readers import _kineto_native as native

    if native.available():
        done = native.tables(payload)
        if done is not None:
            return done
    try:
        events = _EVENTS_DECODER.decode(payload)
    except msgspec.ValidationError:
        loose, problems = _tolerant.loose_events(payload)
        return _tables(loose, problems)
    return _tables(events)


def _read_sliced(path: Path, spill: Path | None = None, helper: bool = True) -> tuple[_Doc, list[_Tables], int]:
    """``_read_sliced_as`` in Kineto's layout, and where a compressed file turns out not to be
    in it, again cut by its structure (``_slices``: any layout of valid JSON; a plain file's
    plan falls back by itself), so a budget holds for any layout."""
    try:
        return _read_sliced_as(path, spill, helper)
    except NotSliceable:
        if spill is not None:
            for f in spill.iterdir():  # (the first pass's slices, if it wrote any)
                f.unlink()
        return _read_sliced_as(path, spill, helper, general=True)


def _read_sliced_as(path: Path, spill: Path | None = None, helper: bool = True, general: bool = False) -> tuple[_Doc, list[_Tables], int]:
    """Decode the file slice by slice (see ``_slices``). Where the compiled decoder is built,
    two threads decode a plain file's slices (``_decoded_in_threads``), or one a compressed
    file's while another decompresses (``_decoded_while_inflating``); else a large plain file
    is shared with a helper process (``_worker``), which decodes from the last slice back
    while this one goes from the first on, until they meet. Raises NotSliceable (or a decode
    error) for the caller to fall back on a whole-document decode. ``spill``: a folder each slice's host and
    GPU tables are written to as ``cpu-N.arrow`` / ``gpu-N.arrow`` (N its index) instead of
    being kept (the tables returned have none). ``helper``: False decodes every slice here."""
    slicer = open_slicer(path, _slice_bytes(path) if helper and spill is None else _CHUNK_BYTES, general=general)
    if general and not isinstance(slicer, Slicer):
        slicer.close()
        raise NotSliceable  # a plain file's plan has tried its structure already
    tables: list[_Tables] = []

    def decoded(piece) -> None:
        t = _slice_tables(piece)
        slicer.done(piece)
        tables.append(t if spill is None else _spilled(t, spill, len(tables)))

    try:
        if isinstance(slicer, MappedSlicer) and helper and _threads_decode():
            with slices_reused():
                tables = _decoded_in_threads(slicer, slicer.plan(), spill)
        elif isinstance(slicer, MappedSlicer):
            ranges = slicer.plan()
            with _Helper(path, ranges, helper) as shared:
                for begin, stop in ranges:
                    if not shared.claim(len(tables)):
                        break  # the helper holds this slice and every one after it
                    decoded(slicer.piece(begin, stop))
                    progress.update(shared.claimed() / len(ranges))
                helped = shared.result(len(tables), spill)
            if helped is None:  # no helper, or it failed: its slices are decoded here
                for begin, stop in ranges[len(tables) :]:
                    decoded(slicer.piece(begin, stop))
            else:
                tables.extend(helped)
        elif helper and _threads_decode():
            with slices_reused():
                tables = _decoded_while_inflating(slicer, spill)
        else:
            for piece in slicer.pieces():
                decoded(piece)
                progress.update(None)  # compressed: the total is not known ahead
        document, size = slicer.document(), slicer.size
    finally:
        slicer.close()
    try:
        doc = msgspec.json.decode(document, type=_Doc)
    except msgspec.ValidationError:
        raise NotSliceable from None  # the document's own shape is odd: the whole-file path says how
    return doc, tables, size


def _slice_bytes(path: Path) -> int:
    """The slices' size: twice ``_CHUNK_BYTES`` where two threads decode a plain file of
    ``WIDE_FROM_BYTES`` or more. A slice's tables cost ~7 ms of polars and Python calls however
    few its events, which wider slices pay half as often: the 514 MB trace 1.50-1.55 ->
    1.40 s, 2.19-2.22 -> 2.04 CPU s, the same peak (381-388 MiB; 64 MiB slices: 1.37 s, but the
    realistic 150 MB trace's peak 177 -> 317 MiB, so smaller traces keep theirs). Not a .gz
    file's: the same 1.9 s, its peak 400 -> 516 MiB (the inflater's pieces queued for wider
    slices). Nor a helper process's (no compiled decoder: each holds its slice's decoded
    events), nor a read within a memory budget (``spill``: as it was measured)."""
    if not _threads_decode():
        return _CHUNK_BYTES
    try:
        size, gz = json_bytes(path)
    except OSError:
        return _CHUNK_BYTES  # (the open that follows says why)
    return 2 * _CHUNK_BYTES if size >= WIDE_FROM_BYTES and not gz else _CHUNK_BYTES


def _threads_decode() -> bool:
    """Whether slices are decoded by two threads of this process: where the compiled decoder
    is built (it parses without the GIL) and the machine has two cores (``helper_allowed``).
    Without it, a helper process shares the slices (``_Helper``)."""
    from proflab.readers import _kineto_native

    return _kineto_native.available() and helper_allowed()


_THREADS = 2  # slices decoded at once (the memory bounds hold two, as with the helper process)


def _decoded_in_threads(slicer: MappedSlicer, ranges: list[tuple[int, int]], spill: Path | None) -> list[_Tables]:
    """Every slice's tables (in file order), decoded by ``_THREADS`` threads, one slice more in hand (``_in_order``): while one thread
    parses (the compiled decoder lets go of the GIL), the other builds its slice's tables
    (polars lets go of it too). No second process: nothing to start, write or read back.
    ``spill``: as ``_read_sliced``'s."""

    def decode(index: int, _) -> _Tables:
        piece = slicer.piece(*ranges[index])
        t = _slice_tables(piece)
        slicer.done(piece)
        return t if spill is None else _spilled(t, spill, index)

    return _in_order(decode, range(len(ranges)), lambda n: progress.update(n / len(ranges)), _THREADS + 1)


def _in_order(decode: Callable[[int, Any], _Tables], items: Iterable, taken: Callable[[int], None], window: int = _THREADS) -> list[_Tables]:
    """``decode(index, item)`` of every item on ``_THREADS`` threads, at most ``window`` at
    once (a plain file's slices, or a .gz file's as they are inflated), the tables taken in
    file order; ``taken(n)`` once the first n are. An error of any (or of ``items``) ends the
    rest and is raised here, with no thread left. A window of one slice more than the threads
    lets a thread that is done start the next slice while the oldest is still decoded (a
    plain file's: the 514 MB trace 1.43 -> 1.39 s, the realistic 1.5 GB one 3.39 -> 3.20 s,
    peak 646 -> 662 MiB of its bound 862); a .gz file's keep two (its inflated slices waiting
    raised the peak 387 -> 425 MiB for no gain)."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    tables: list[_Tables] = []
    decoding: deque = deque()

    def take() -> None:
        tables.append(decoding.popleft().result())
        taken(len(tables))

    pool = ThreadPoolExecutor(_THREADS, thread_name_prefix="proflab-read")
    try:
        for index, item in enumerate(items):
            decoding.append(pool.submit(decode, index, item))
            del item
            if len(decoding) == window:
                take()
        while decoding:
            take()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return tables


def _decoded_while_inflating(slicer: Slicer, spill: Path | None) -> list[_Tables]:
    """Every slice's tables of a compressed trace: a thread decompresses and cuts the slices
    (zlib and ISA-L let go of the GIL) while ``_THREADS`` others decode them, one slice
    queued between the two sides; this one takes the tables in file order. With one decoding
    thread the decode was the bottleneck (the 514 MB trace as a 50 MB .gz: ISA-L inflates it
    in 0.33 s, a slice's parse and tables take 1.3 s in all). An error of any (a truncated or
    corrupt .gz, a slice that is not JSON) ends all and is raised here. ``spill``: as
    ``_read_sliced``'s."""
    import queue
    import threading

    handed: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    end = object()

    def hand(item) -> bool:
        while not stop.is_set():
            try:
                handed.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def inflate() -> None:
        try:
            for piece in slicer.pieces():
                if not hand(piece):
                    return
            hand(end)
        except BaseException as e:  # (raised in the reading thread)
            hand(e)

    def decode(index: int, piece: bytearray) -> _Tables:
        t = _slice_tables(piece)
        return t if spill is None else _spilled(t, spill, index)

    def handed_pieces() -> Iterator[bytearray]:
        while (item := handed.get()) is not end:
            if isinstance(item, BaseException):
                raise item
            yield item

    worker = threading.Thread(target=inflate, name="proflab-inflate", daemon=True)
    worker.start()
    try:
        # (compressed: the total is not known ahead)
        return _in_order(decode, handed_pieces(), lambda n: progress.update(None))
    finally:
        stop.set()
        worker.join()


class _NoRoom(Exception):
    """A decoded slice could not be written to disk (a full or unwritable folder)."""


def _spilled(t: _Tables, folder: Path, index: int) -> _Tables:
    """Slice ``index``'s tables with its host and GPU events written to ``folder``."""
    try:
        t.gpu.write_ipc(folder / f"gpu-{index}.arrow")
        t.cpu.write_ipc(folder / f"cpu-{index}.arrow")
    except OSError as e:
        raise _NoRoom(e.strerror or str(e)) from None
    except pl.exceptions.PolarsError as e:
        raise _NoRoom(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from None
    return t._replace(gpu=None, cpu=None)


class _Helper:
    """Runs ``proflab.readers._worker`` over the slices this process has not claimed (see its
    module doc for how the two share them). Without a helper (a small trace, one core, or a
    helper that did not start) every claim succeeds. ``result(first)`` gives the helper's
    tables, of slices ``first`` to the last, or None when there is none or it failed."""

    def __init__(self, path: Path, ranges: list[tuple[int, int]], allowed: bool = True) -> None:
        self.slices = len(ranges)
        self.mine = 0  # slices this process claimed
        self.proc: subprocess.Popen | None = None
        self.tmp: tempfile.TemporaryDirectory | None = None
        if self.slices < HELPER_FROM_SLICES or not allowed or not helper_allowed():
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

    def claim(self, index: int) -> bool:
        """Whether this process decodes slice ``index`` (claimed in order from the first)."""
        if self.proc is not None:
            try:
                if not claim(Path(self.tmp.name), index):
                    return False
            except OSError:  # claims cannot be made: the helper is stopped, its slices read here
                self._stop()
        self.mine += 1
        return True

    def claimed(self) -> int:
        """Slices claimed by both processes so far (for progress)."""
        if self.proc is None:
            return self.mine
        try:  # (both processes' claims are files)
            return sum(1 for n in os.listdir(self.tmp.name) if n.startswith("claim-"))
        except OSError:
            return self.mine

    def result(self, first: int, spill: Path | None = None) -> list[_Tables] | None:
        """The helper's slices' tables; with ``spill``, their host and GPU tables moved into
        that folder (as ``_read_sliced`` names them) rather than read."""
        if self.proc is None or self.tmp is None:
            return None
        if first == self.slices:  # every slice was decoded here: the helper has none
            self._stop()
            return []
        try:
            if self.proc.wait() != 0:
                return None
            out = Path(self.tmp.name)
            meta = json.loads((out / "meta.json").read_text())
            if meta["first"] != first or len(meta["slices"]) != self.slices - first:
                return None
            # one file per slice: the helper never holds more than one slice's tables
            parts = [(_ipc(out / f"gpu-{i}.arrow", spill), _ipc(out / f"cpu-{i}.arrow", spill), pl.read_ipc(out / f"comms-{i}.arrow"))
                     for i in range(first, self.slices)]
        except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError, pl.exceptions.PanicException):
            return None
        if any(dict(g.schema) != GPU_SCHEMA or dict(c.schema) != CPU_SCHEMA or dict(m.schema) != COMM_SCHEMA for g, c, m in parts):
            return None
        if spill is not None:
            try:
                for i in range(first, self.slices):
                    for table in ("gpu", "cpu"):
                        shutil.move(out / f"{table}-{i}.arrow", spill / f"{table}-{i}.arrow")
            except OSError:
                return None  # (the slices are decoded again here, and written over)
        return [
            _Tables(None if spill else g, None if spill else c, Counter(s["unknown"]), int(s["events"]),
                    Counter({tuple(k): n for *k, n in s["problems"]}), m)
            for (g, c, m), s in zip(parts, meta["slices"], strict=True)
        ]

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


def _ipc(file: Path, schema_only: Path | None) -> pl.DataFrame:
    """An Arrow file's table, or (``schema_only``) none of its rows: its schema is checked."""
    return pl.read_ipc(file, n_rows=0) if schema_only is not None else pl.read_ipc(file)


def _cuda_version(v: int | None) -> str | None:
    # CUDA encodes 13.0 as 13000 and CUPTI 13.0.1 as 130001.
    if v is None:
        return None
    if v >= 100000:
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    return f"{v // 1000}.{v // 10 % 100}"


def _int(v: Any, problems: Counter, name: str) -> int | None:
    if v is None or (type(v) is int and -(2**63) <= v < 2**63):
        return v
    if type(v) is str and v.strip().lstrip("-").isdigit() and -(2**63) <= int(v) < 2**63:
        problems[name, "a string", "read as an integer"] += 1
        return int(v)
    problems[name, _tolerant.kind(v), "ignored"] += 1
    return None


def _flag(v: Any, problems: Counter, name: str) -> bool | None:
    if v is None or type(v) in (bool, int):
        return None if v is None else bool(v)
    problems[name, _tolerant.kind(v), "ignored"] += 1
    return None


def _text(v: Any) -> str | None:
    return str(v) if type(v) in (int, str) else None


def _meta(doc: _Doc) -> tuple[dict[str, Any], Counter]:
    """TraceMeta's fields from the document, each checked: a field of an unexpected type is
    dropped and counted, never fatal."""
    problems: Counter = Counter()
    schema = doc.schemaVersion
    if schema is not None and type(schema) not in (int, str):
        problems["schemaVersion", _tolerant.kind(schema), "ignored"] += 1
        schema = None
    dist = doc.distributedInfo
    if dist is not None and not isinstance(dist, dict):
        problems["distributedInfo", _tolerant.kind(dist), "ignored"] += 1
        dist = None
    versions = {
        "kineto_schema": None if schema is None else str(schema),
        "cuda_driver": _cuda_version(_int(doc.cuda_driver_version, problems, "cuda_driver_version")),
        "cuda_runtime": _cuda_version(_int(doc.cuda_runtime_version, problems, "cuda_runtime_version")),
        "cupti": _cuda_version(_int(doc.cupti_version, problems, "cupti_version")),
        "roctracer": _text(doc.roctracer_version),
        "hip_runtime": _text(doc.hip_runtime_version),
    }
    fields = {
        "format_version": None if schema is None else str(schema),
        "base_time_ns": _int(doc.baseTimeNanoseconds, problems, "baseTimeNanoseconds"),
        "with_stack": _flag(doc.with_stack, problems, "with_stack"),
        "record_shapes": _flag(doc.record_shapes, problems, "record_shapes"),
        "profile_memory": _flag(doc.profile_memory, problems, "profile_memory"),
        "distributed": dist,
        "versions": {k: v for k, v in versions.items() if v is not None},
    }
    return fields, problems


def _not_json(path: Path, e: msgspec.DecodeError):
    msg = str(e)
    if "truncated" in msg:
        raise TruncatedInput(path, "JSON ends early (truncated file)") from e
    raise CorruptInput(path, f"not valid JSON ({msg})") from e


def _decode(path: Path, data: bytes) -> tuple[_Doc | _LooseDoc | list, Counter]:
    """The whole document: strictly typed, else tolerantly (see ``_tolerant``)."""
    try:
        return _DECODER.decode(data), Counter()
    except msgspec.ValidationError as e:
        msg = str(e)
        if "missing required field `traceEvents`" in msg:
            raise UnsupportedFormat(path, "JSON, but not a profiler trace: it has no 'traceEvents' array") from e
        if msg.startswith("Expected `object | array`"):
            raise UnsupportedFormat(path, f"JSON, but not a profiler trace ({msg})") from e
    except msgspec.DecodeError as e:
        _not_json(path, e)
    # A value of an unexpected type somewhere: decode loosely, then check field by field.
    # (The strict decode stopped at that value: what follows may still be malformed JSON.)
    problems: Counter = Counter()
    try:
        doc = _LOOSE_DECODER.decode(data)
    except msgspec.ValidationError:  # (a DecodeError subclass: caught first)
        try:
            raw = msgspec.json.decode(data)
        except msgspec.DecodeError as e:
            _not_json(path, e)
        events = raw.get("traceEvents") if isinstance(raw, dict) else raw
        if not isinstance(events, list):
            raise UnsupportedFormat(path, "JSON, but not a profiler trace: 'traceEvents' is not an array") from None
        if isinstance(raw, dict):
            head = {k: v for k, v in raw.items() if k != "traceEvents" and k in _LooseDoc.__struct_fields__}
            doc = msgspec.convert({**head, "traceEvents": []}, _LooseDoc)
            doc.traceEvents = _tolerant.from_python(events, problems)
        else:
            doc = _tolerant.from_python(events, problems)
        del raw, events
    except msgspec.DecodeError as e:
        _not_json(path, e)
    if isinstance(doc, list):
        return _tolerant.sanitize(doc, problems), problems
    doc.traceEvents = _tolerant.sanitize(doc.traceEvents, problems)
    return doc, problems


_NO_DIMS = (None, None, None)


def _xyz(values: list[list[int] | None]) -> list[pl.Series]:
    """x, y and z of grid or block dims in one pass (a comprehension beats building a polars
    List column from Python lists by ~20x)."""
    rows = [_NO_DIMS if v is None else (*v[:3], None, None, None)[:3] for v in values]
    return [pl.Series(axis, dtype=pl.Int32) for axis in zip(*rows)]


def _gpu_table(evs: list[_Event]) -> pl.DataFrame:
    if not evs:
        return pl.DataFrame(schema=GPU_SCHEMA)
    get = attrgetter
    args = list(map(get("args"), evs))
    device = pl.Series(list(map(get("device"), args)), dtype=pl.Int32)
    stream = pl.Series(list(map(get("stream"), args)), dtype=pl.Int64)
    grid_x, grid_y, grid_z = _xyz(list(map(get("grid"), args)))
    block_x, block_y, block_z = _xyz(list(map(get("block"), args)))
    return _gpu_frame(
        {
            "kind": pl.Series(list(map(get("cat"), evs)), dtype=pl.String).replace_strict(_GPU_CATS, return_dtype=GPU_SCHEMA["kind"]),
            "name": pl.Series(list(map(get("name"), evs)), dtype=pl.String),
            "device": device.fill_null(_ints(list(map(get("pid"), evs)), pl.Int32)),
            "stream": stream.fill_null(_ints(list(map(get("tid"), evs)))),
            "start_ns": _ns(list(map(get("ts"), evs))),
            "dur_ns": _ns(list(map(get("dur"), evs))).clip(lower_bound=0),
            "correlation": pl.Series(list(map(get("correlation"), args)), dtype=pl.Int64),
            "external_id": _external_ids(args),
            "bytes": pl.Series(list(map(get("bytes"), args)), dtype=pl.Int64),
            "grid_x": grid_x,
            "grid_y": grid_y,
            "grid_z": grid_z,
            "block_x": block_x,
            "block_y": block_y,
            "block_z": block_z,
            "registers": pl.Series(list(map(get("registers"), args)), dtype=pl.Int32),
            "shared_mem_bytes": pl.Series(list(map(get("shared_memory"), args)), dtype=pl.Int64),
        }
    )


def _gpu_frame(columns: dict[str, pl.Series]) -> pl.DataFrame:
    """The GPU table from its columns as read (kind and name, the args'), its copies'
    directions and communication kernels told from the names (``gpu_columns``)."""
    df = pl.DataFrame(columns)
    return df.hstack(name_facts(df.get_column("name")).get_columns()).select(gpu_columns())


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
    host = _host_columns(evs)
    types, dims, concrete = _shapes(host["name"], lambda i: (args[i].input_types, args[i].input_dims, args[i].input_concrete))
    return _cpu_frame(
        pl.Series(list(map(get("cat"), evs)), dtype=pl.String).replace_strict(_CPU_CATS, return_dtype=CPU_SCHEMA["cat"]),
        host,
        _external_ids(args),
        pl.Series(list(map(get("correlation"), args)), dtype=pl.Int64),
        pl.Series(list(map(get("sequence"), args)), dtype=pl.Int64),
        types,
        dims,
        concrete,
    )


def _cpu_frame(cat: pl.Series, host: dict[str, pl.Series], external_id: pl.Series, correlation: pl.Series,
               sequence: pl.Series, types: pl.Series, dims: pl.Series, concrete: pl.Series) -> pl.DataFrame:
    """The host table's operator rows from their columns (``cat`` as the model names it)."""
    return pl.DataFrame(
        {
            "cat": cat,
            **host,
            "external_id": external_id,
            "correlation": correlation,
            "sequence": sequence,
            "input_types": types,
            "input_dims": dims,
            "input_concrete": concrete,
        }
    ).select(cpu_columns("python_id", "python_parent_id"))


def _shapes(names: pl.Series, raw: Callable[[int], tuple[Any, Any, Any]]) -> tuple[pl.Series, pl.Series, pl.Series]:
    """Input dtypes, dims and concrete inputs of the operators that carry them
    (``record_shapes``); ``raw(i)``: operator i's ``Input type``, ``Input Dims`` and
    ``Concrete Inputs`` as JSON (empty where absent). The names are picked by polars
    (``shape_ops``)."""
    picked = np.flatnonzero(shape_ops(names))
    types: list[str | None] = [None] * len(names)
    dims: list[str | None] = [None] * len(names)
    concrete: list[str | None] = [None] * len(names)
    seen: dict[tuple, str | None] = {}  # a model's operators repeat a few shapes: each decoded once
    for i in picked.tolist():
        input_types, input_dims, input_concrete = raw(i)
        if input_types:
            types[i] = _decoded_once(seen, input_types, _dtypes)
        if input_dims:
            dims[i] = _decoded_once(seen, input_dims, _dims)
        if input_concrete:
            concrete[i] = _decoded_once(seen, input_concrete, _dims)
    return tuple(pl.Series(values, dtype=CPU_SCHEMA[c]) for values, c in  # type: ignore[return-value]
                 ((types, "input_types"), (dims, "input_dims"), (concrete, "input_concrete")))  # fmt: skip


def _decoded_once(seen: dict, raw, decode: Callable[[Any], str | None]) -> str | None:
    key = (decode, bytes(raw))
    if key not in seen:
        seen[key] = decode(raw)
    return seen[key]


def _frame_table(evs: list[_Event]) -> pl.DataFrame:
    """Python frames (with_stack): only what the source-line walk needs."""
    args = list(map(attrgetter("args"), evs))
    return _frame_frame(
        _host_columns(evs),
        pl.Series(list(map(attrgetter("python_id"), args)), dtype=pl.Int64),
        pl.Series(list(map(attrgetter("python_parent_id"), args)), dtype=pl.Int64),
    )


def _frame_frame(host: dict[str, pl.Series], python_id: pl.Series, python_parent_id: pl.Series) -> pl.DataFrame:
    """The host table's Python-frame rows from their columns."""
    return pl.DataFrame({**host, "python_id": python_id, "python_parent_id": python_parent_id}).select(frame_columns())


# deviceProperties keys, with the names PyTorch 1.8's computeProperties used for some of them
_DEVICE_KEYS = {
    "device": ("id",),
    "name": ("name",),
    "sm_count": ("numSms", "multiProcessorCount"),
    "compute_major": ("computeMajor", "major"),
    "compute_minor": ("computeMinor", "minor"),
    "total_memory_bytes": ("totalGlobalMem",),
    "max_threads_per_sm": ("maxThreadsPerMultiprocessor", "maxThreadsPerMultiProcessor"),
    "regs_per_sm": ("regsPerMultiprocessor",),
    "shared_mem_per_sm_bytes": ("sharedMemPerMultiprocessor",),
}


def _devices(doc, problems: Counter) -> pl.DataFrame:
    """Device properties as the trace lists them (``deviceProperties``, or 1.8's
    ``computeProperties``); a value of an unexpected type is dropped and counted."""
    props = doc.deviceProperties if doc.deviceProperties is not None else doc.computeProperties
    if props is None:
        return pl.DataFrame(schema=DEVICE_SCHEMA)
    if not isinstance(props, list):
        problems["deviceProperties", _tolerant.kind(props), "ignored"] += 1
        return pl.DataFrame(schema=DEVICE_SCHEMA)
    rows = []
    for p in props:
        if not isinstance(p, dict):
            problems["deviceProperties", _tolerant.kind(p), "ignored"] += 1
            continue
        row = {}
        for col, keys in _DEVICE_KEYS.items():
            v = next((p[k] for k in keys if k in p), None)
            if col == "name":
                ok = type(v) is str
            else:
                bound = 2**63 if DEVICE_SCHEMA[col] == pl.Int64 else 2**31
                ok = type(v) is int and -bound <= v < bound
            if v is not None and not ok:
                problems[f"deviceProperties.{keys[0]}", _tolerant.kind(v), "ignored"] += 1
                v = None
            row[col] = v
        if row["name"] == "":
            row["name"] = None
        rows.append(row)
    return pl.DataFrame(rows, schema=DEVICE_SCHEMA)
