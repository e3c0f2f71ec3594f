"""A trace analysed within a memory budget.

What reading and analysing a trace whole holds in memory grows with its events (a 3.5 GB
Nsight Systems capture needs 8-9 GB whole, a 4 GB Kineto trace about 2 GB), so a trace whose
whole analysis would pass the budget is analysed in a part that fits:

- **the estimate**: the peak of a whole read and analysis, from what the file says before it
  is read: an export's event-table row counts (rowid bounds, two B-tree seeks a table), a
  Kineto trace's size; with the per-event costs measured on real traces (``COST_*``,
  ``KINETO_*``; ``benchmarks/bench_nsys_large.py``, ``bench_scaling.py``);
- **the part** (:func:`choose`): the middle of the trace by where its memory goes, from the
  start times of a sample of its events (an export's rows found by rowid seeks; a Kineto
  trace's events as its slices were decoded to disk), as wide as the budget allows with a
  margin; whole profiler steps where the trace has them, else a time window, read as
  ``--steps`` / ``--window`` read them (``model.slicing``): memory follows the part;
- **the check** (:func:`likeness`): the part's kernel time per kernel, and its share of
  copies, against the whole trace's (SQLite aggregates over an export's kernel and copy
  tables; a streaming group-by over a Kineto trace's decoded slices), so the report says how
  far the part is like the whole and names the kernel, or the copies, that differ most.

The notes the report carries say all three: what reading it whole would need, what was
analysed, and how alike the part and the whole are.
"""

from __future__ import annotations

import dataclasses
import sqlite3

import polars as pl

from proflab.errors import UsageError
from proflab.model.slicing import SliceSpec

# the whole-read estimates, known without polars (the CLI sizes polars' allocator by them)
from proflab.readers import _kineto_size
from proflab.readers._export_rows import COST_FIXED, COST_GPU, COST_HOST, estimate, whole_bytes
from proflab.readers._export_rows import ALL_PARTS_MARGIN, PART_MARGIN
from proflab.readers._export_rows import GPU_TABLES as _GPU
from proflab.readers._kineto_size import KINETO_ALONE_EVENT, KINETO_EVENT, KINETO_FIXED

__all__ = ["DEFAULT_BUDGET", "COST_FIXED", "COST_GPU", "COST_HOST", "KINETO_FIXED", "KINETO_EVENT", "KINETO_PART_FIXED",
           "KINETO_PART_EVENT", "KINETO_PART_MARGIN", "KINETO_HELPER", "KINETO_ALONE_EVENT", "Plan", "whole_bytes", "estimate", "plan",
           "choose", "cuts", "cut_times", "by_launch", "each_part", "parts", "likeness", "kernel_likeness", "notes", "noted", "size_text", "kineto_need"]

DEFAULT_BUDGET = 1_500_000_000  # bytes: the peak an analysis may reach by default (1.5 GB)

_SAMPLES = 4096  # rows of each table whose start places its events in time
_UNLIKE_POINTS = 5.0  # a kernel's share of kernel time differing more: the part is not like the whole
_UNLIKE_STEP = 0.1  # the part's median step this much (a fraction) off the whole's: not alike
_TOP = 10  # the whole trace's kernels with the most time compared


@dataclasses.dataclass(frozen=True)
class Plan:
    """The part of a trace to analyse within the budget. ``lo_ns``/``hi_ns``: its span on the
    trace's clock; ``steps``: (first, stop) profiler step numbers when it is whole steps."""

    budget: int
    need: int  # estimated peak of reading the trace whole (bytes)
    lo_ns: int
    hi_ns: int
    steps: tuple[int, int] | None
    step_too_big: bool  # the trace has steps, but none fits the budget whole

    def part(self, origin_ns: int) -> SliceSpec:
        if self.steps is not None:
            return SliceSpec(steps=self.steps, text=f"steps {self.steps[0]}:{self.steps[1]}")
        a, b = (self.lo_ns - origin_ns) // 1000 * 1000, -((origin_ns - self.hi_ns) // 1000) * 1000  # whole us: the text is exact
        return SliceSpec(window_ns=(a, b), text=f"window {_ms(a)}:{_ms(b)}")


def noted(trace, notes: list[str], budget: int | None = None, **meta):
    """``trace`` with ``notes`` added, and ``budget`` as the budget it was read in a part for
    (and ``meta``'s other fields)."""
    meta = dataclasses.replace(trace.meta, notes=(*trace.meta.notes, *notes), budget=budget, **meta)
    return dataclasses.replace(trace, meta=meta)


def size_text(b: float) -> str:
    """Bytes as MB below 1 GB, else GB (decimal, as --memory-budget takes them)."""
    return f"{b / 1e6:.0f} MB" if b < 1e9 else f"{b / 1e9:.1f} GB"


def _count(n: int) -> str:
    return f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n:,}"


def _ms(ns: int, places: int = 3) -> str:
    return f"{ns / 1e6:.{places}f}".rstrip("0").rstrip(".") + "ms"


def _room(budget: int, fixed: int, margin: float) -> float:
    """What a part may fill (bytes): ``margin`` of the budget above ``fixed``. Raises
    UsageError for a budget below ``fixed``, what any analysis needs."""
    room = (budget - fixed) * margin
    if room <= 0:
        raise UsageError(f"--memory-budget {budget / 1e6:.0f} MB: below the {fixed / 1e6:.0f} MB any analysis of this trace needs")
    return room


def choose(times, weights, *, need: int, budget: int, fixed: int, steps: pl.DataFrame, margin: float) -> Plan:
    """The middle stretch of a trace that fits ``budget``: ``times`` (ns) of a sample of its
    events, each standing for ``weights`` bytes of the whole analysis (so they sum to about
    ``need - fixed``), filling ``margin`` of the room above ``fixed``; whole ``steps`` inside
    that stretch where the trace has any. Raises UsageError for a budget below ``fixed``, what
    any analysis needs."""
    import numpy as np

    room = _room(budget, fixed, margin)
    order = np.argsort(times, kind="stable")
    t, cum = times[order], np.cumsum(weights[order])
    first = (cum[-1] - room) / 2  # the middle of the trace by where its memory goes
    i = int(np.searchsorted(cum, max(first, 0.0)))
    j = int(np.searchsorted(cum, first + room))
    lo, hi = int(t[min(i, t.size - 1)]), (int(t[j]) if j < t.size else int(t[-1]) + 1)
    hi = max(hi, lo + 1)
    if steps.height:
        inside = steps.filter((pl.col("start_ns") >= lo) & (pl.col("end_ns") <= hi))
        if inside.height:
            a, b = int(inside["step"].min()), int(inside["step"].max()) + 1
            kept = steps.filter((pl.col("step") >= a) & (pl.col("step") < b))
            return Plan(budget, need, int(kept["start_ns"].min()), int(kept["end_ns"].max()), (a, b), False)
        return Plan(budget, need, lo, hi, None, True)
    return Plan(budget, need, lo, hi, None, False)


def cuts(times, weights, *, budget: int, fixed: int, steps: pl.DataFrame, origin: int, margin: float,
         calls=None) -> list[SliceSpec]:
    """Consecutive parts of a trace that each fit ``budget`` and together hold all of it, for
    an analysis of every event (``report.combine``); ``times``, ``weights``, ``fixed`` and
    ``margin`` as for :func:`choose`. Whole profiler steps where the trace has them and none
    alone passes the room (each part as many steps as fit, from the first: its GPU work follows its host
    calls, so no step is cut and no kernel is in two parts; the first part reaches back to the
    trace's first event and the last to its end, ``SliceSpec.to_ends``); else
    time windows from the trace's first event (``origin``) that meet exactly (an event across
    a cut is clipped into both, as ``--window`` cuts), each cut moved to the start of the next
    of ``calls`` (ns: a sample of the host's runtime calls), so that no call of that thread
    is running there: a synchronising call cut in two would leave its part a sync without
    its return."""
    import numpy as np

    room = _room(budget, fixed, margin)
    order = np.argsort(times, kind="stable")
    t, cum = np.asarray(times)[order], np.cumsum(np.asarray(weights, dtype=np.float64)[order])
    if t.size == 0:
        return [SliceSpec(window_ns=(None, None), text="window :")]
    if steps.height:
        s = steps.sort("start_ns")
        before = lambda x: np.where((i := np.searchsorted(t, x, side="left")) > 0, cum[np.maximum(i - 1, 0)], 0.0)  # noqa: E731
        w = before(s["end_ns"].to_numpy()) - before(s["start_ns"].to_numpy())
        numbers = s["step"].to_list()
        # (steps numbered out of time order, or twice, cannot be cut by number: windows)
        if w.max() <= room and all(a < b for a, b in zip(numbers, numbers[1:])):
            first = []
            held = room + 1  # (the first step starts a part)
            for i, x in enumerate(w):
                if held + x > room:
                    first.append(i)
                    held = 0.0
                held += x
            bounds = [numbers[i] for i in first] + [None]
            return [SliceSpec(steps=(None if k == 0 else a, b), text=f"steps {a}:{'' if b is None else b}", to_ends=True)
                    for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    k = max(2, int(np.ceil(cum[-1] / room)))
    at = t[np.minimum(np.searchsorted(cum, cum[-1] * np.arange(1, k) / k), t.size - 1)]
    if calls is not None and len(calls):
        c = np.sort(np.asarray(calls))
        at = np.where((i := np.searchsorted(c, at)) < c.size, c[np.minimum(i, c.size - 1)], at)
    edges = sorted({int(x) - origin for x in at} - {0})
    bounds = [None, *edges, None]
    return [SliceSpec(window_ns=(a, b), text=f"window {_ms(a or 0, 6)}:{'' if b is None else _ms(b, 6)}") for a, b in zip(bounds, bounds[1:])]


def cut_times(specs: list[SliceSpec], origin: int, steps: pl.DataFrame) -> list[int]:
    """Where consecutive parts (:func:`cuts`) meet on the host, on the trace's clock (ns): a
    window part's start, or a step part's first step's; [] for parts that do not meet so."""
    rows = dict(zip(steps["step"].to_list(), steps["start_ns"].to_list(), strict=True)) if steps.height else {}
    out = []
    for s in specs[1:]:
        if s.window_ns is not None and s.window_ns[0] is not None:
            out.append(origin + s.window_ns[0])
        elif s.steps is not None and s.steps[0] in rows:
            out.append(int(rows[s.steps[0]]))
        else:
            return []
    return out


def by_launch(specs: list[SliceSpec], latest: list[dict[int, int]], processes: set[int]) -> list[SliceSpec]:
    """Parts (:func:`cuts`) whose GPU work is theirs by launch (``SliceSpec.correlations``):
    ``latest[i]``, per process (``correlation >> 32``), the highest correlation id launched
    before cut ``i`` (:func:`cut_times`); ``processes``: those with any launch. Ids are
    ranges between cuts, so every activity with an id is in one part: the one its launch call
    starts in, where ids rise with time as CUPTI's and Kineto's do, and work whose launch
    the trace lacks (another process's, one before the capture) where its id falls."""
    if not specs or not processes:
        return specs
    # below every id of the process: none launched before the cut
    at = [{k: cut.get(k, (k << 32) - 1) for k in sorted(processes)} for cut in latest]
    bounds = [None, *at, None]
    return [dataclasses.replace(s, correlations=tuple((k, None if a is None else a[k], None if b is None else b[k]) for k in sorted(processes)))
            for s, a, b in zip(specs, bounds, bounds[1:])]


def each_part(specs: list[SliceSpec], after: list, read, budget: int, nothing: Exception):
    """The parts ``read(spec)`` gives (a reader's, for an analysis of every event), each noted
    with the budget and the next part's first work (``after[i]``: ``TraceMeta
    .next_part_work``), read with the next part's host events up to that work's launch
    (``SliceSpec.ahead``), and not held while the next is read; a part of no event (``read``
    raising UsageError: a stretch of no host call and no work launched) is skipped, and
    ``nothing`` is raised where no part holds one."""
    given = 0
    for i, spec in enumerate(specs):
        nxt = after[i] if i < len(after) else ()
        # the next part's host events on the threads that launch its first work, up to those
        # launches, the calls included: the host side of the gaps that work ends, which are
        # this part's (``Trace.next_part_host``)
        until: dict[int, int] = {}
        for w in nxt:
            if w.tid is not None and w.launch_start_ns is not None:
                until[w.tid] = max(until.get(w.tid, 0), w.launch_start_ns + 1)
        if until:
            spec = dataclasses.replace(spec, ahead=tuple(sorted(until.items())))
        try:
            trace = read(spec)
        except UsageError:
            continue
        given += 1
        yield noted(trace, [], budget, next_part_work=nxt)
        del trace
    if not given:
        raise nothing


def kernel_likeness(rows: list[tuple], copies: tuple[int, int] | None = None) -> dict | None:
    """From (kernel, whole ns, part ns) rows: the kernel time in each (ns), and the largest
    difference in share of kernel time (percentage points) among the whole trace's ``_TOP``
    kernels with the most time, with that kernel and both its shares. ``copies``: the copy
    time (ns) of the whole trace and of the part; where the whole has some, the share of
    copies in each's kernel and copy time and how far apart they are (``copies_*``): a part
    whose kernels are alike may still copy more or less (a warm-up loading data, a phase of
    checkpointing). None without kernel time in the whole or the part."""
    whole, part = sum(w for _, w, _ in rows), sum(p for _, _, p in rows)
    if whole <= 0 or part <= 0:
        return None
    top = sorted(rows, key=lambda r: -r[1])[:_TOP]
    diffs = [(abs(100 * w / whole - 100 * p / part), k, 100 * w / whole, 100 * p / part) for k, w, p in top]
    worst = max(diffs, key=lambda d: d[0])
    like = {"whole_ns": whole, "part_ns": part, "points": worst[0], "kernel": worst[1],
            "whole_pct": worst[2], "part_pct": worst[3], "compared": len(top)}  # fmt: skip
    if copies is not None and copies[0] > 0:
        w, p = copies
        like.update(copies_whole_pct=100 * w / (whole + w), copies_part_pct=100 * p / (part + p))
        like["copies_points"] = abs(like["copies_part_pct"] - like["copies_whole_pct"])
    return like


def notes(path_name: str, p: Plan, kept: int, events: int, like: dict | None, *, what_whole: str = "export",
          estimated: str = "from its tables' rows", steps: pl.DataFrame | None = None) -> list[str]:
    """What the report says of a part read for the budget. ``what_whole``: "export" or
    "trace"; ``estimated``: what the estimate of the whole read came from; ``steps``: the
    whole trace's profiler steps (``step``, ``start_ns``, ``end_ns``), whose durations the
    part's are compared with when the part is whole steps."""
    w = what_whole
    out = _what_was_read(path_name, p, kept, events, estimated) + _kernels_alike(like, w)
    if p.steps is not None and steps is not None and steps.height:
        out.append(_steps_alike(steps, p.steps, w))
    return out


def _steps_alike(steps: pl.DataFrame, part: tuple[int, int], w: str) -> str:
    """The part's median step (host ranges) against the whole trace's."""
    dur = (pl.col("end_ns") - pl.col("start_ns")) / 1e6
    inside = steps.filter((pl.col("step") >= part[0]) & (pl.col("step") < part[1]))
    mine, theirs = inside.select(dur.median()).item(), steps.select(dur.median()).item()
    n = inside.height
    line = (f"memory budget: the part's {n} step{'s take a median of' if n != 1 else ' takes'} {mine:,.3f} ms (host ranges), "
            f"the whole {w}'s {steps.height} steps a median of {theirs:,.3f} ms")
    if theirs and abs(mine - theirs) > _UNLIKE_STEP * theirs:
        line += f"; the part's steps are NOT like the whole {w}'s: analyse other steps with --steps"
    return line


def _what_was_read(path_name: str, p: Plan, kept: int, events: int, estimated: str) -> list[str]:
    what = (f"profiler {p.part(0).text}" if p.steps is not None else
            f"a time window in its middle ({(p.hi_ns - p.lo_ns) / 1e6:,.1f} ms)" + (", since no whole profiler step fits it" if p.step_too_big else ""))
    return [
        f"memory budget: reading {path_name} whole would need about {size_text(p.need)} ({_count(events)} events, estimated "
        f"{estimated}), over the budget of {size_text(p.budget)}; analysed {what}: {kept:,} of its {events:,} events "
        f"({100 * kept / max(events, 1):.0f}%). A larger --memory-budget (or none) reads more; --steps / --window choose the part; analyze --all-parts analyses every event, in parts"
    ]


def _kernels_alike(like: dict | None, w: str) -> list[str]:
    """The part's kernel time per kernel, and its share of copies, against the whole trace's
    (see ``kernel_likeness``)."""
    if like is None:
        return [f"memory budget: the {w} has no kernels to compare the part with the whole {w} by"]
    name = like["kernel"] if len(like["kernel"]) <= 80 else like["kernel"][:77] + "..."
    share = f"the part runs {like['part_ns'] / 1e6:,.1f} ms of kernels, {100 * like['part_ns'] / like['whole_ns']:.0f}% of the {w}'s {like['whole_ns'] / 1e6:,.1f} ms"
    copies = "copies_points" in like
    shares = (f"copies are {like['copies_part_pct']:.1f}% of its kernel and copy time, {like['copies_whole_pct']:.1f}% of the {w}'s"
              if copies else "")  # fmt: skip
    other = "; analyse other parts with --steps / --window"
    if like["points"] > _UNLIKE_POINTS:
        return [f"memory budget: {share}; the part is NOT like the whole {w}: {name} takes {like['part_pct']:.1f}% of its kernel "
                f"time and {like['whole_pct']:.1f}% of the {w}'s ({like['points']:.1f} points apart){'; ' + shares if copies else ''}{other}"]
    if copies and like["copies_points"] > _UNLIKE_POINTS:
        return [f"memory budget: {share}; the part is NOT like the whole {w}: {shares} ({like['copies_points']:.1f} points apart){other}"]
    return [f"memory budget: {share}; the {w}'s {like['compared']} kernels with the most time take shares of kernel time "
            f"in the part within {like['points']:.1f} points of their shares in the whole {w}{'; ' + shares if copies else ''}"]


# -- Nsight Systems exports ---------------------------------------------------------------------


def plan(con: sqlite3.Connection, rows: dict[str, int], budget: int, steps: pl.DataFrame) -> Plan | None:
    """The part of an export to read, or None when reading it whole fits ``budget``.
    ``rows``: each event table's rows; ``steps``: the export's profiler steps
    (``step``, ``start_ns``, ``end_ns``). Raises UsageError for a budget below what any
    analysis needs."""
    need = estimate(rows)
    if need <= budget:
        return None
    sample = _sample(con, rows)
    if sample is None:
        return None  # nothing dated: the whole read says what the export holds
    return choose(*_weighted(sample, rows), need=need, budget=budget, fixed=COST_FIXED, steps=steps, margin=PART_MARGIN)


def parts(con: sqlite3.Connection, rows: dict[str, int], budget: int, steps: pl.DataFrame, origin: int) -> list[SliceSpec] | None:
    """An export's consecutive parts for an analysis of every event within ``budget``
    (:func:`cuts`, from the same sample of its rows' starts as :func:`plan`); None when
    reading it whole fits, or nothing is dated."""
    import numpy as np

    if estimate(rows) <= budget:
        return None
    sample = _sample(con, rows)
    if sample is None:
        return None
    calls = [sample[t] for t in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER") if t in sample]
    return cuts(*_weighted(sample, rows), budget=budget, fixed=COST_FIXED, steps=steps, origin=origin, margin=ALL_PARTS_MARGIN,
                calls=np.concatenate(calls) if calls else None)


def _sample(con: sqlite3.Connection, rows: dict[str, int]) -> dict | None:
    """Per event table, the start times (ns) of a sample of its rows; None when no row is
    dated."""
    got = {table: _sampled_starts(con, table, _SAMPLES) for table in rows}
    got = {table: starts for table, starts in got.items() if starts.size}
    return got or None


def _weighted(sample: dict, rows: dict[str, int]):
    """The sampled starts as one array, and the bytes of a whole read and analysis each
    stands for."""
    import numpy as np

    weights = [np.full(s.size, rows[t] * (COST_GPU if t in _GPU else COST_HOST) / s.size) for t, s in sample.items()]
    return np.concatenate(list(sample.values())), np.concatenate(weights)


def _sampled_starts(con: sqlite3.Connection, table: str, k: int):
    """The start times (ns) of up to ``k`` rows spread evenly over ``table``'s rowids: rows
    found by seeks of the rowid B-tree, so the cost follows ``k``, not the table."""
    import numpy as np

    try:
        low, top = con.execute(f'SELECT (SELECT min(rowid) FROM "{table}"), (SELECT max(rowid) FROM "{table}")').fetchone()
    except sqlite3.OperationalError:
        return np.empty(0, dtype=np.int64)
    if low is None or top is None or type(low) is not int or type(top) is not int:
        return np.empty(0, dtype=np.int64)
    ids = np.unique(np.linspace(low, top, num=min(k, top - low + 1)).astype(np.int64))
    listed = ", ".join(map(str, ids.tolist()))
    try:
        got = con.execute(f'SELECT start FROM "{table}" WHERE rowid IN ({listed}) AND start IS NOT NULL').fetchall()
    except sqlite3.OperationalError:
        return np.empty(0, dtype=np.int64)
    return np.array([v for (v,) in got if type(v) is int and -(2**62) < v < 2**62], dtype=np.int64)


def likeness(ctx, lo: int, hi: int) -> dict | None:
    """How far the kernels running in [lo, hi) of an export are like the whole export's, and
    its share of copies (see :func:`kernel_likeness`), from SQLite aggregates over its kernel
    and copy tables (``_time_in``; ``ctx``: the reader's context, whose ``string_of`` names a
    StringIds id). None without kernels."""
    kernels = _time_in(ctx, "CUPTI_ACTIVITY_KIND_KERNEL", lo, hi, by="demangledName")
    if kernels is None:
        return None
    copies = _time_in(ctx, "CUPTI_ACTIVITY_KIND_MEMCPY", lo, hi) or {}
    like = kernel_likeness([(k, w, p) for k, (w, p) in kernels.items()], copies.get(None))
    if like is not None:
        like["kernel"] = ctx.string_of(like["kernel"])
    return like


def _time_in(ctx, table: str, lo: int, hi: int, by: str | None = None) -> dict | None:
    """Per value of the column ``by`` (None: one total, keyed None), the table's time in the
    whole export and inside [lo, hi) (ns): one SQLite aggregate in a rowid range per reading
    thread (``ctx.halves``, ``ctx.scan``), their sums added; sums that are not integers (a
    damaged export) are left out. None where the table or its columns are missing, or a sum
    overflows."""
    if table not in ctx.tables:
        return None
    key, group = (f"{by}, ", f" GROUP BY {by}") if by else ("NULL, ", "")
    try:
        pieces = ctx.scan([
            f"SELECT {key}sum(end - start), sum(CASE WHEN start < {hi} AND end > {lo} THEN min(end, {hi}) - max(start, {lo}) "
            f"ELSE 0 END) FROM {table} WHERE end >= start AND {rows}{group}"
            for rows in ctx.halves(table)
        ])  # fmt: skip
    except sqlite3.OperationalError:
        return None
    sums: dict = {}
    for k, w, p in (row for got in pieces for row in got):
        if type(w) is int and type(p) is int:
            had = sums.get(k, (0, 0))
            sums[k] = (had[0] + w, had[1] + p)
    return sums


# -- Kineto traces ------------------------------------------------------------------------------

# A part read (``kineto._read_spilled``): the slices decoded one at a time to disk peak at
# 186 MB (the 514 MB benchmark trace, a part of one event), 318 MB with the helper process
# decoding beside (so it runs only where the budget holds both); reading the part back and
# analysing it then costs 320-375 bytes an event (a part of 614 k events: 400 MB).
KINETO_PART_FIXED = 190_000_000
KINETO_PART_EVENT = 400
KINETO_PART_MARGIN = 0.8  # of the room above KINETO_PART_FIXED a part is planned to fill (one part or every one)
KINETO_HELPER = 140_000_000


def kineto_need(path, events: int | None = None) -> int:
    """The estimated peak (bytes) of reading and analysing a Kineto trace whole
    (``_kineto_size.need``: from its ``events`` where counted, else its size)."""
    return _kineto_size.need(path, events)
