"""Readers: one module per input format. Each sniffs its format and raises on bad input.

``load(path)`` picks the reader: Kineto (torch.profiler) JSON, plain, gzip or xz; Nsight Systems
SQLite exports, and ``.nsys-rep`` reports through ``nsys export``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from proflab._heap import release
from proflab.errors import InputNotFound, UnsupportedFormat

if TYPE_CHECKING:
    from proflab.model.slicing import SliceSpec

__all__ = ["load", "load_trace", "load_parts", "expand_paths"]

_TRACE_SUFFIXES = (".json", ".json.gz", ".json.xz", ".sqlite", ".nsys-rep")
# budget.DEFAULT_BUDGET, not imported: the package loads without polars (tests keep them equal)
_DEFAULT_BUDGET = 1_500_000_000


def expand_paths(paths: list[str | Path]) -> list[Path]:
    """Files as given, and trace files inside directories (a tensorboard_trace_handler folder)."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            # a `proflab run` directory keeps its traces in traces/, beside meta.json and the
            # analysis (which is JSON too, but not a trace)
            if (p / "meta.json").is_file() and (p / "traces").is_dir():
                p = p / "traces"
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(_TRACE_SUFFIXES) and not _companion(f))
            if not found:
                raise InputNotFound(p, "directory holds no trace files (*.json, *.json.gz, *.json.xz)")
            out.extend(found)
        elif p.exists():
            out.append(p)
        else:
            raise InputNotFound(p, "no such file or directory")
    return out


# keys a Kineto / Chrome-trace object carries near its start (metadata precedes the events)
_TRACE_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"', b'"displayTimeUnit"', b'"traceName"')


def _companion(f: Path) -> bool:
    """A JSON file in a trace folder that is not a trace (ground truth, settings, a run's
    notes written beside the traces): a JSON object with none of a trace's keys in its first
    64 KiB. Only for files found in a folder; a file named on the command line is read (and
    refused with the reason if it is not a trace)."""
    if not f.name.endswith((".json", ".json.gz", ".json.xz")):
        return False
    import gzip
    import zlib

    if f.name.endswith(".xz"):
        import lzma

        opener, damaged = lzma.open, (lzma.LZMAError,)
    else:
        opener, damaged = gzip.open if f.name.endswith(".gz") else open, (zlib.error,)
    try:
        with opener(f, "rb") as fh:
            head = fh.read(1 << 16)
    except (OSError, EOFError, *damaged):
        return False  # unreadable or damaged: the reader says why
    head = head.lstrip()
    return head.startswith(b"{") and not any(k in head for k in _TRACE_KEYS)


def load(path: str | Path, *, cache: bool | None = None, part: SliceSpec | None = None, budget: int | None = None):
    """Read one trace file into a :class:`proflab.model.Trace`.

    ``cache``: use the columnar cache (``_cache``; None: when the file is large enough,
    False: never). ``part``: only some steps or a time window (``proflab.model.slicing``);
    from a cached trace only that part is read. ``budget`` (bytes; None: no limit): a trace
    whose whole analysis is estimated to need more is read in a part that fits
    (``readers.budget``), and a ``part`` of it in memory that follows the part; such a trace
    is neither read from nor written to the cache, which holds whole traces."""
    from proflab._timings import phase

    with phase("decode"):
        return _load(path, cache, part, budget)


def _load(path: str | Path, cache: bool | None, part: SliceSpec | None, budget: int | None):
    from dataclasses import replace

    import polars as pl

    from proflab.model.slicing import slice_frames, slice_trace, with_frames
    from proflab.model.trace import CPU_SCHEMA, GPU_SCHEMA, STEP_SCHEMA, Trace, empty
    from proflab.readers import _cache

    p = Path(path)
    if not p.exists():
        raise InputNotFound(p, "no such file or directory")
    if p.is_dir():
        raise UnsupportedFormat(p, "is a directory; pass one trace file (or use expand_paths)")
    if budget is not None and _over_budget(p, budget):
        # read in memory that follows the part (given, or the budget's), and never cached:
        # the cache holds whole traces
        from proflab.readers import kineto, nsys_sqlite

        reader = nsys_sqlite if _is_nsys(p) else kineto
        return reader.read(p, part, budget=budget)
    use_cache = _cache.enabled(p, cache)
    if use_cache:
        entry = _cache.scan_entry(p)
        if entry is not None:
            meta = replace(entry.meta, source=str(path))
            try:
                if part is None:
                    return Trace(**{k: entry.collect(k) for k in entry.frames}, meta=meta)
                devices = entry.collect("devices")
                whole = Trace(gpu=empty(GPU_SCHEMA), cpu=empty(CPU_SCHEMA), steps=empty(STEP_SCHEMA), devices=devices, meta=meta, comms=entry.collect("comms"))
                f = entry.frames
                gpu, cpu, steps, note, ahead = slice_frames(f["gpu"], f["cpu"], f["steps"], part, str(path))
                return with_frames(whole, entry.collect("gpu", gpu), entry.collect("cpu", cpu), steps.collect(), note,
                                   None if ahead is None else entry.collect("cpu", ahead))
            except (OSError, pl.exceptions.PolarsError, pl.exceptions.PanicException, TypeError, IndexError):
                _cache.drop(p)  # damaged after all: read the trace again
    if part is not None and _is_nsys(p):
        # an export is cut inside SQLite: only the part is read (and nothing is cached,
        # which would need the whole)
        from proflab.readers import nsys_sqlite

        return nsys_sqlite.read(p, part)
    trace = _read(p, budget if part is None else None)
    release()  # what the reader freed of the C heap (``proflab._heap``)
    if use_cache and trace.meta.budget is None:
        _cache.store(p, trace)
    return slice_trace(trace, part)


def load_trace(path: str | Path, *, cache: bool | None = None, steps: str | None = None, window: str | None = None,
               memory_budget: int | None = _DEFAULT_BUDGET):
    """:func:`load` as ``proflab.load`` takes it (the public read, which this is): ``steps``
    ("10:20") or ``window`` ("100ms:250ms") as text, and the memory budget by default."""
    from proflab.model.slicing import parse_steps, parse_window

    if steps is not None and window is not None:
        from proflab.errors import UsageError

        raise UsageError("give steps or window, not both")
    part = parse_steps(steps) if steps is not None else parse_window(window) if window is not None else None
    return load(path, cache=cache, part=part, budget=memory_budget)


def load_parts(path: str | Path, *, budget: int, cache: bool | None = None) -> Iterator:
    """Every event of one trace file as consecutive :class:`proflab.model.Trace` parts that
    each fit ``budget`` (bytes), read one at a time as they are asked for
    (``readers.budget.cuts``; ``report.combine`` analyses them): the trace whole, once, where
    its whole analysis fits (from the cache as :func:`load` reads it)."""
    from proflab.readers import kineto, nsys_sqlite

    p = Path(path)
    report = p.is_file() and _is_nsys(p) and not nsys_sqlite.sniff(p)  # a .nsys-rep: sized once converted
    if not report and (not p.exists() or p.is_dir() or not _over_budget(p, budget)):
        yield load(p, cache=cache, budget=budget)
        return
    yield from (nsys_sqlite if _is_nsys(p) else kineto).read_parts(p, budget)


def _over_budget(p: Path, budget: int) -> bool:
    """Whether ``p`` is an Nsight Systems export or a Kineto trace whose whole analysis is
    estimated to need more than ``budget`` bytes (a ``.nsys-rep`` is known only once
    converted: its read decides)."""
    from proflab.readers import budget as limits
    from proflab.readers import kineto, nsys_sqlite

    if nsys_sqlite.sniff(p):
        whole = limits.whole_bytes(p)
        return whole is not None and whole[1] > budget
    if _is_nsys(p) or not kineto.sniff(p):
        return False
    try:
        return limits.kineto_need(p) > budget
    except OSError:
        return False  # (the read says what is wrong with the file)


def _is_nsys(p: Path) -> bool:
    from proflab.readers import nsys_sqlite

    return nsys_sqlite.sniff(p) or p.suffix == ".nsys-rep"


def _read(p: Path, budget: int | None = None):
    from proflab.readers import kineto, nsys_sqlite

    if _is_nsys(p):
        return nsys_sqlite.read(p, budget=budget)
    if kineto.sniff(p):
        return kineto.read(p)
    raise UnsupportedFormat(
        p,
        "not a format proflab reads (expected a torch.profiler/Kineto trace: JSON, JSON.gz or JSON.xz; "
        "or an Nsight Systems export: .sqlite or .nsys-rep)",
    )
