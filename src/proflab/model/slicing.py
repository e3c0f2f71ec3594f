"""Part of a trace: some profiler steps (``--steps 10:20``) or a time window
(``--window 100ms:250ms``).

A slice is a host-time window ``[lo, hi)`` (ns, the trace's clock):

* ``--steps A:B`` is the ``ProfilerStep#N`` with ``A <= N < B`` (Python slice semantics over
  step numbers; ``A:`` and ``:B`` leave a side open, ``N`` alone is one step), and the window
  runs from the first one's start to the last one's end;
* ``--window START:END`` is relative to the trace's first event, in ``ns``, ``us``, ``ms``
  (the default unit) or ``s``.

Kept with ``--steps``: the selected steps, host events overlapping their span, and the GPU
activities those host calls launched (a kernel launched in step 19 that runs after it ends is
step 19's; one launched in step 9 is not step 10's, even if it runs then). With ``--window``
the cut is exact: host and GPU events overlapping the window, clipped to it, and the steps
wholly inside it. Everything works on lazy
frames, so a cached trace is filtered while it is read and the rest is never materialized.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from proflab.errors import UsageError
from proflab.model.trace import Trace

__all__ = ["SliceSpec", "ahead_condition", "parse_steps", "parse_window", "slice_frames", "slice_trace", "selected_steps", "steps_bounds", "window_bounds", "host_overlap", "launched_by"]

_UNITS_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_TIME = re.compile(r"^\s*(-?\d+(?:\.\d*)?|\.\d+)\s*(ns|us|ms|s)?\s*$")


@dataclass(frozen=True)
class SliceSpec:
    """What part to analyse. ``steps``: (first, stop) step numbers, either None for open;
    ``window_ns``: (start, end) relative to the trace's first event, either None for open."""

    steps: tuple[int | None, int | None] | None = None
    window_ns: tuple[int | None, int | None] | None = None
    text: str = ""
    # For the consecutive parts of a trace analysed in parts (``readers.budget.by_launch``):
    # GPU work is the part's by its launch, not its time, and whole: per process
    # (``correlation >> 32``; Kineto's one process is 0) the correlation ids in (first, last]
    # (None: open), and work without an id, or of a process with no launches, by its start
    # inside the part's host window. Host events as ``--window`` or ``--steps`` keep them.
    correlations: tuple[tuple[int, int | None, int | None], ...] | None = None
    # With ``steps``, for the same parts: a side left open (no FIRST, no STOP) reaches to the
    # trace's first or last event, so the parts hold what lies before and after the steps.
    to_ends: bool = False
    # For the same parts, but the last: per (thread, time in ns), the next part's host events
    # of that thread starting from this part's end until before that time (just past the
    # launch of the next part's first work on a device) are read too, as
    # ``Trace.next_part_host``: the host side of the idle gap that work ends, which is this
    # part's (``readers.budget.each_part``); at most 1/AHEAD_SHARE of the part's span past it.
    ahead: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.steps is not None and self.window_ns is not None:
            raise UsageError("give --steps or --window, not both")


def parse_steps(text: str) -> SliceSpec:
    """``"10:20"``, ``"10:"``, ``":20"`` or ``"12"``."""
    raw = text.strip()
    try:
        if ":" not in raw:
            n = int(raw)
            bounds: tuple[int | None, int | None] = (n, n + 1)
        else:
            a, b = raw.split(":", 1)
            bounds = (int(a) if a.strip() else None, int(b) if b.strip() else None)
    except ValueError:
        raise UsageError(f"--steps {text}: expected FIRST:STOP step numbers, such as 10:20 (steps 10 to 19)") from None
    if bounds[0] is not None and bounds[1] is not None and bounds[1] <= bounds[0]:
        raise UsageError(f"--steps {text}: selects no step (STOP must be greater than FIRST)")
    return SliceSpec(steps=bounds, text=f"steps {raw}")


def _time_ns(part: str, text: str) -> int | None:
    if not part.strip():
        return None
    m = _TIME.match(part)
    if not m:
        raise UsageError(f"--window {text}: expected START:END times such as 100ms:250ms (units ns, us, ms, s; ms if none)")
    return round(float(m.group(1)) * _UNITS_NS[m.group(2) or "ms"])


def parse_window(text: str) -> SliceSpec:
    """``"100ms:250ms"``, ``"1.5s:"``, ``":300"`` (ms), relative to the trace's first event."""
    if ":" not in text:
        raise UsageError(f"--window {text}: expected START:END, such as 100ms:250ms")
    a, b = text.split(":", 1)
    lo, hi = _time_ns(a, text), _time_ns(b, text)
    if lo is not None and hi is not None and hi <= lo:
        raise UsageError(f"--window {text}: END must be after START")
    return SliceSpec(window_ns=(lo, hi), text=f"window {text.strip()}")


_END = pl.col("start_ns") + pl.col("dur_ns")


def _clipped(frame: pl.LazyFrame, lo: int, hi: int) -> pl.LazyFrame:
    start = pl.max_horizontal(pl.col("start_ns"), pl.lit(lo))
    end = pl.min_horizontal(_END, pl.lit(hi))
    return frame.with_columns(start.alias("start_ns"), (end - start).clip(lower_bound=0).alias("dur_ns"))


def selected_steps(all_steps: pl.DataFrame, spec: SliceSpec, source: str) -> pl.DataFrame:
    """The profiler steps ``--steps`` selects. Raises UsageError (one line) when none."""
    first, stop = spec.steps or (None, None)
    sel = all_steps
    if first is not None:
        sel = sel.filter(pl.col("step") >= first)
    if stop is not None:
        sel = sel.filter(pl.col("step") < stop)
    if sel.height == 0:
        have = (
            f"its steps are {all_steps['step'].min()} to {all_steps['step'].max()}"
            if all_steps.height
            else "it has no ProfilerStep#N ranges"
        )
        raise UsageError(f"{source}: --{spec.text} selects no step; {have}")
    return sel


def steps_bounds(sel: pl.DataFrame, spec: SliceSpec, all_steps: pl.DataFrame) -> tuple[int, int]:
    """The host window [lo, hi) of the selected steps; for the parts of a trace analysed in
    parts (``SliceSpec.to_ends``) each part's window runs to the next one's first step, and
    the open sides to the trace's ends, so that the parts' windows meet."""
    lo, hi = int(sel["start_ns"].min()), int(sel["end_ns"].max())
    first, stop = spec.steps or (None, None)
    if spec.to_ends:
        later = all_steps.filter(pl.col("step") >= stop)["start_ns"] if stop is not None else None
        lo = -(2**62) if first is None else lo
        hi = 2**62 if stop is None else (int(later.min()) if later is not None and later.len() else hi)
    return lo, hi


def window_bounds(spec: SliceSpec, origin_ns: int | None, source: str) -> tuple[int, int]:
    """``--window``'s [lo, hi) in the trace's clock, from the trace's first event."""
    if origin_ns is None:
        raise UsageError(f"{source}: --{spec.text} on a trace with no events")
    a, b = spec.window_ns or (None, None)
    return (origin_ns + a if a is not None else -(2**62)), (origin_ns + b if b is not None else 2**62)


def host_overlap(lo: int, hi: int) -> pl.Expr:
    """Events that overlap [lo, hi) (an instant event at lo counts)."""
    return (pl.col("start_ns") < hi) & ((_END > lo) | (pl.col("start_ns") >= lo))


def launched_by(ids: tuple[tuple[int, int | None, int | None], ...]) -> pl.Expr:
    """GPU work whose correlation id is in one of ``SliceSpec.correlations``' ranges (its
    process's: ``correlation >> 32``)."""
    c = pl.col("correlation")
    process = c // (1 << 32)
    by_id = pl.lit(False)
    for key, first, last in ids:
        this = process == key
        if first is not None:
            this = this & (c > first)
        if last is not None:
            this = this & (c <= last)
        by_id = by_id | this
    return c.is_not_null() & by_id


def _launched_in(ids: tuple[tuple[int, int | None, int | None], ...], lo: int, hi: int) -> pl.Expr:
    """GPU work of a part by its launch (``SliceSpec.correlations``); work without an id, or
    of a process with no launches, by its start in [lo, hi)."""
    c = pl.col("correlation")
    by_time = (pl.col("start_ns") >= lo) & (pl.col("start_ns") < hi)
    return launched_by(ids) | ((c.is_null() | ~(c // (1 << 32)).is_in([k for k, _, _ in ids])) & by_time)


def slice_frames(
    gpu: pl.LazyFrame, cpu: pl.LazyFrame, steps: pl.LazyFrame, spec: SliceSpec, source: str,
    *, origin_ns: int | None = None, all_steps: pl.DataFrame | None = None,
) -> tuple[pl.LazyFrame, pl.LazyFrame, pl.LazyFrame, str]:
    """The sliced gpu, cpu and steps frames, a note saying what was kept, and the host events
    past the part's end that ``SliceSpec.ahead`` asks for (None where it asks for none). Raises
    UsageError (one line) when the slice selects nothing. ``origin_ns`` (the first event) and
    ``all_steps`` are the whole trace's, for frames a reader already cut to the part (they
    default to these frames')."""
    all_steps = steps.collect() if all_steps is None else all_steps
    if spec.steps is not None:
        sel = selected_steps(all_steps, spec, source)
        lo, hi = steps_bounds(sel, spec, all_steps)
        kept_steps = sel
    else:
        if origin_ns is None:
            t0 = pl.concat(
                [gpu.select(pl.col("start_ns").min()), cpu.select(pl.col("start_ns").min())]
            ).collect()["start_ns"].min()
            origin_ns = None if t0 is None else int(t0)
        lo, hi = window_bounds(spec, origin_ns, source)
    overlaps = host_overlap(lo, hi)
    starts_inside = (pl.col("start_ns") >= lo) & (pl.col("start_ns") < hi)
    if spec.steps is not None and spec.correlations is not None:
        # a part of every event's: the work launched in it by correlation id (no kernel in two
        # parts); host events across a cut whole in both, each counted by its start
        cpu_kept = cpu.filter(overlaps)
        gpu_kept = gpu.filter(_launched_in(spec.correlations, lo, hi))
    elif spec.steps is not None:
        cpu_kept = cpu.filter(overlaps)
        launched = cpu_kept.select("correlation").drop_nulls().unique().with_columns(pl.lit(True).alias("_launched"))
        gpu_kept = (
            gpu.join(launched, on="correlation", how="left", maintain_order="left")
            .filter(pl.col("_launched").fill_null(False) | (pl.col("correlation").is_null() & starts_inside))
            .drop("_launched")
        )
    else:
        # a time window is cut exactly: events are clipped to it, steps kept when whole
        cpu_kept = _clipped(cpu.filter(overlaps), lo, hi)
        gpu_kept = _clipped(gpu.filter(overlaps), lo, hi) if spec.correlations is None else gpu.filter(_launched_in(spec.correlations, lo, hi))
        kept_steps = all_steps.filter((pl.col("start_ns") >= lo) & (pl.col("end_ns") <= hi))
    n_all = all_steps.height
    note = f"analysed part of the trace: {spec.text} ({kept_steps.height} of {n_all} profiler steps)"
    first = int(kept_steps["start_ns"].min()) if spec.steps is not None else origin_ns
    return gpu_kept, cpu_kept, kept_steps.lazy(), note, _ahead(cpu, spec, lo, hi, first)


def _ahead(cpu: pl.LazyFrame, spec: SliceSpec, lo: int, hi: int, first: int | None) -> pl.LazyFrame | None:
    """The host events past the part's end that ``SliceSpec.ahead`` asks for (``ahead_condition``):
    for a time window, which cuts events at hi, also the rest of those running across it,
    from hi on. None where none are asked for."""
    cond = ahead_condition(spec, lo, hi, lambda tid, until: (pl.col("tid") == tid) & (pl.col("start_ns") < until), pl.Expr.or_,
                           first=first)
    if cond is None:
        return None
    if spec.steps is not None:  # (an event across the cut is whole in the part already)
        return cpu.filter(cond & (pl.col("start_ns") >= hi))
    return _clipped(cpu.filter(cond & (_END > hi)), hi, 2**62)


# a part reads the next part's host events (``SliceSpec.ahead``) at most 1/AHEAD_SHARE of its
# own span past its end
AHEAD_SHARE = 8


def ahead_condition(spec: SliceSpec, lo: int, hi: int, one, either, *, first: int | None = None):
    """The condition (``one(tid, until)`` for each thread, joined by ``either``) on the next
    part's host events that ``SliceSpec.ahead`` asks a part [lo, hi) to read, each thread's
    until no later than hi plus 1/AHEAD_SHARE of the part's span (a device idle long into the
    next part must not read the next part in). The span runs from lo, or where lo is open
    (the first part reaches back to the trace's start) from ``first``: the part's first step,
    or the trace's first event; no bound where neither is known. None for no condition."""
    start = lo if lo > -(2**61) else first
    cap = hi + (hi - start) // AHEAD_SHARE if start is not None else None
    cond = None
    for tid, until in spec.ahead:
        until = until if cap is None else min(until, cap)
        if until > hi:
            cond = one(tid, until) if cond is None else either(cond, one(tid, until))
    return cond


def slice_trace(trace: Trace, spec: SliceSpec | None, *, origin_ns: int | None = None, all_steps: pl.DataFrame | None = None) -> Trace:
    """The part of an in-memory trace that ``spec`` selects (the trace itself for None);
    ``origin_ns`` and ``all_steps`` as for :func:`slice_frames`."""
    if spec is None:
        return trace
    gpu, cpu, steps, note, ahead = slice_frames(
        trace.gpu.lazy(), trace.cpu.lazy(), trace.steps.lazy(), spec, trace.meta.source, origin_ns=origin_ns, all_steps=all_steps
    )
    return with_frames(trace, gpu.collect(), cpu.collect(), steps.collect(), note, None if ahead is None else ahead.collect())


def with_frames(trace: Trace, gpu: pl.DataFrame, cpu: pl.DataFrame, steps: pl.DataFrame, note: str,
                ahead: pl.DataFrame | None = None) -> Trace:
    from dataclasses import replace

    if gpu.height == 0 and cpu.height == 0:
        raise UsageError(f"{trace.meta.source}: {note.split(': ', 1)[1].split(' (')[0]} holds no events")
    meta = replace(trace.meta, notes=(*trace.meta.notes, note))
    return Trace(gpu=gpu, cpu=cpu, steps=steps, devices=trace.devices, meta=meta, comms=trace.comms, next_part_host=ahead)
