"""A trace analysed in consecutive parts, reported as one: every event within the memory budget.

A trace whose whole analysis would pass ``--memory-budget`` is analysed by default in one
part from its middle (``readers.budget``), a sample of it. With ``--all-parts``
(``analyze(path, all_parts=True)``) every event is analysed instead: the trace is cut into
consecutive parts that each fit the budget (whole profiler steps where it has them, else time
windows; ``readers.budget.cuts``), each part is read and analysed in turn by every analysis
and rule, and the report is combined from what each part leaves behind, small tables, so
memory follows one part while time follows the whole trace. What the combined report says:

- a part's GPU work is the work its host calls launched (``readers.budget.by_launch``), so
  no activity is in two parts or in none; its span runs from where the part before's ends
  to where the next part's first work starts (``TraceMeta.next_part_work``), so the spans
  meet and the gap before that work is whole in it, its cause read from that work's launch;
  where a part's work runs beside the next part's (the GPU behind the host), the time is
  counted once (``timeline.combined_breakdowns``) and a gap the next part's work fills is
  not idle (``_idle_by_cause``);
- **exactly** over the parts: each device's time per kind of work, the steps (each whole in
  one part, its GPU work with it), kernels' counts and total, mean and longest times, launch
  dims and operators, copies, launch counts and launches per step, idle gaps by cause, user
  ranges, host operators, and the observer model's GPU work and profiled step per step (its
  per-step figures are kept, and their medians taken over all);
- **within 0.1 %**: medians and percentiles of kernel durations, launch calls and launch
  delays (value counts in logarithmic bins, ``analysis.quantiles``); the observer model's
  host time per step (a launch call held up on a full queue is told by its part's median
  launch call, not the whole trace's);
- what is not exact: a host event across a cut is in each part it spans (counted once per
  part; a range's host time once, cut at the cut); where the host runs more than a part ahead
  of its GPU, the sync that owns a gap may be a later part's call, and the gap takes another
  cause; idle no part's gaps hold is of unknown cause, said in the notes;
- **findings**: each part's rules run on that part. A finding of several parts is one
  finding: a gain whose fix the what-if model replays is predicted again over all parts'
  steps (``whatif.graph.concat``), a gain per step is the parts' mean weighted by their
  steps, any other the sum of theirs; its share and severity are over the combined window,
  its title and evidence those of the part where it gains most; ``evidence`` adds
  ``part`` (that part) and ``found_in_parts``; one found in only some parts is kept where it
  passes its rule's floor over the combined window too (``_over_the_whole``), as a whole
  analysis would decide. The host-side rules' gains (sync, host and launch overhead) are
  not summed but decided again over all parts' sums with the whole trace's observer
  (``rules.host.over_parts``): the profiler's correction is a median per step times the
  steps, capped by what was observed, which a sum of per-part corrections is not. The trace
  is healthy where none reaches warning level over the combined window;
- a part reads the host side of its gaps as the whole trace would: the next part's host
  events on the threads that launch its first work, up to those launches
  (``Trace.next_part_host``; at most ``slicing.AHEAD_SHARE``'s share of the part's span past
  it), and each thread's last host event end in the parts before (``observer.host_reach``);
- GPU memory's timeline is per part and not combined: said as missing;
- where the FLOPs go (``analysis.perf``): each part's operator calls, summed per signature
  and step, are summed over the parts, exactly; each step's FLOPs and MFU are its part's;
- whether a part finds a host-side finding at all is decided by medians over its own steps:
  parts of few steps (under ``FEW_STEPS``) are said in the notes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import polars as pl

from proflab._timings import phase
from proflab.analysis.timeline import event_cost as _event_cost
from proflab.analysis.timeline import kernels as _kernels
from proflab.analysis.timeline import launch as _launch
from proflab.analysis.timeline import memcpy as _memcpy
from proflab.analysis.timeline import observer as _observer
from proflab.analysis import quantiles as _quantiles
from proflab.analysis.timeline import breakdown as _timeline
from proflab.analysis.context import Context
from proflab.analysis.perf import combined as combined_perf
from proflab.analysis.timeline.ranges import combined_range_tables
from proflab.analysis.whatif import WhatIf
from proflab.analysis.whatif.model import replay_central_at, replay_cost_us
from proflab.analysis.whatif.graph import concat
from proflab.analysis.timeline.breakdown import PartLevels
from proflab.errors import UsageError
from proflab.model import Trace
from proflab.report import Finding, Missing, Report
from proflab.report import assemble as _a
from proflab.report.predicted import combined, with_overlaps
from proflab.rules._common import MIN_GAIN_PCT, WARNING_PCT, ms, repredicted, severity
from proflab.rules._common import pct as _pct
from proflab.rules.host import over_parts, part_sums
from proflab.rules.memcpy import reported_without_gain

__all__ = ["report_in_parts"]

_PART_NOTE = "analysed part of the trace: "
# parts of fewer profiler steps than this: per-part medians over steps may not be the whole's
FEW_STEPS = 8


@dataclasses.dataclass
class _Gaps:
    """A part's idle gaps as the combination needs them (see ``_gaps_of``)."""

    inner: pl.DataFrame  # per cause (``n``, ``ns``): the gaps no other part's work can fill
    late: pl.DataFrame  # gaps (device, start_ns, end_ns, cause) after the part's last host call


@dataclasses.dataclass
class _Part:
    """What one part leaves for the combined report."""

    label: str
    note: str  # its slicing note ("... (k of N profiler steps)")
    report: Report
    has_gpu: bool
    window: tuple[int, int]
    levels: PartLevels | None
    steps: pl.DataFrame
    step_count: int
    kernels: pl.DataFrame
    kernel_ns: pl.DataFrame | None
    kernel_modes: dict[str, pl.DataFrame] | None
    launch: dict | None
    observer_steps: pl.DataFrame | None
    memcpy: pl.DataFrame
    gaps: _Gaps | None
    ranges: pl.DataFrame
    host_ops: pl.DataFrame
    events: int
    host_sums: dict | None  # what the host-side rules decide from (``rules.host.part_sums``)
    whatif_graph: Any = None  # the part's step graph, replayed with the others' (``analysis.whatif``)
    event_cost: Any = None  # the profiler's per-event cost the part measured (``event_cost.EventCost``)
    graph_left_out: bool = False  # its graph was left out of the combined replay for the memory budget
    perf: Any = None  # the part's operator performance model (``analysis.perf``), summed with the others'


def report_in_parts(parts: Iterable[Trace], *, top_kernels: int = 15, bare_step_ms: float | None = None,
                    on_part: Callable[[int, str], None] | None = None, each: Callable[[Context], None] | None = None) -> Report:
    """The report of a trace given as consecutive parts (``readers.load_parts``): each part
    analysed in turn and freed before the next is read, the report combined from them (see
    the module doc). A trace given whole (one part) is reported as ``analyze`` reports it.
    ``on_part(n, label)``: called as the n-th part (from 1) is analysed, for progress;
    ``each(ctx)``: with each part's analysis context once its report is built, for what else
    is taken from every part (a comparison's tables: ``report.compare.combined_part``)."""
    it = iter(parts)
    try:
        with phase("decode"):  # (a part is read as it is asked for)
            trace = next(it, None)
        if trace is None:
            raise UsageError("the trace's parts hold no events")
        if trace.meta.budget is None:  # read whole: the budget held it
            ctx = Context(trace, bare_step_ms=bare_step_ms)
            report = _a.report_for(ctx, top_kernels=top_kernels)
            if each is not None:
                each(ctx)
            return report
        done: list[_Part] = []
        reach = None  # per thread, the latest end of a host event in the parts so far
        while trace is not None:
            if on_part is not None:
                on_part(len(done) + 1, _label(trace))
            # the parts' spans meet: each from where the one before ends (its GPU work queued
            # behind the host calls of the next is then inside its own span, not taken for idle)
            ctx = Context(trace, bare_step_ms=bare_step_ms, part=True, starts_at=done[-1].window[1] if done else None,
                          host_before=reach)
            done.append(_digest(ctx, _a.report_for(ctx, top_kernels=top_kernels)))
            _spread_graphs(done, trace.meta.budget)
            if each is not None:
                each(ctx)
            mine = _observer.host_reach(trace.cpu)
            reach = mine if reach is None else pl.concat([reach, mine]).group_by("tid").agg(pl.col("end_ns").max())
            del ctx, trace  # before the next part is read
            with phase("decode"):
                trace = next(it, None)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()  # (a reader's temporary files go with it)
    with phase("timeline"):  # (the parts' tables combined; their replay as one is the what-if's)
        return _combined(done, top_kernels, bare_step_ms)


# The parts' step graphs kept for the combined replay hold at most this share of the memory
# budget: each holds a part's host calls and GPU operations (~220 bytes each), and all parts'
# together grew with the trace (a 0.5 GB trace in 11 parts: 63 MiB of graphs, a peak of 370 MiB
# under a 250 MB budget). Past it, every other kept graph is left out and from then on every
# other part's: a spread of the trace's steps, replayed as the whole trace's.
_GRAPH_SHARE = 0.1


def _spread_graphs(done: list[_Part], budget: int | None) -> None:
    """Leave out the step graphs of every other part kept so far where they hold more than
    their share of ``budget`` (bytes); the replay says how many parts' steps it took."""
    if budget is None:
        return
    kept = [p for p in done if p.whatif_graph is not None]
    if sum(_graph_bytes(p.whatif_graph) for p in kept) <= _GRAPH_SHARE * budget:
        return
    for p in kept[1::2]:
        p.whatif_graph = None
        p.graph_left_out = True


def _graph_bytes(g) -> int:
    arrays = [v for v in vars(g).values() if isinstance(v, np.ndarray)]
    return sum(a.nbytes for a in arrays) + 64 * len(g.op_name)


def _steps_in_trace(parts: list[_Part]) -> int | None:
    """The whole trace's profiler steps, as each part's slicing note counts them."""
    for p in parts:
        m = re.search(r"\(\d+ of (\d+) profiler steps\)", p.note)
        if m:
            return int(m.group(1))
    return None


def _label(trace: Trace) -> str:
    """What part of the trace this is ("steps 3:31", "window 0ms:277.1ms"), from its note."""
    return _part_note(trace).removeprefix(_PART_NOTE).split(" (")[0]


def _part_note(trace: Trace) -> str:
    """The slicing note that says which part this is: "analysed part of the trace: ..."."""
    return next((n for n in trace.meta.notes if n.startswith(_PART_NOTE)), "")


def _digest(ctx: Context, report: Report) -> _Part:
    trace, gpu = ctx.trace, ctx.trace.has_gpu
    if "launch" not in (ctx.part_digest or {}):  # a part of host calls only: their launches count too
        ctx.launch_stats
    d = ctx.part_digest or {}
    return _Part(
        label=_label(trace),
        note=_part_note(trace),
        report=report,
        has_gpu=gpu,
        window=ctx.window,
        levels=d.get("levels") if gpu else None,
        steps=ctx.step_table,
        step_count=trace.steps.height,
        kernels=ctx.hot_kernels(None) if gpu else pl.DataFrame(),
        kernel_ns=d.get("kernel_ns"),
        kernel_modes=d.get("kernel_modes"),
        launch=d.get("launch"),
        observer_steps=d.get("observer_steps"),
        event_cost=d.get("event_cost"),
        memcpy=ctx.memcpy_table if gpu else pl.DataFrame(),
        gaps=_gaps_of(ctx) if gpu else None,
        ranges=ctx.range_table,
        host_ops=_a.host_op_table(trace),
        events=trace.gpu.height + trace.cpu.height,
        host_sums=part_sums(ctx) if gpu else None,
        whatif_graph=_whatif_graph(ctx) if gpu else None,
        perf=d.get("perf"),
    )


def _whatif_graph(ctx: Context):
    """The part's step graph (``Context.whatif`` puts it in the part's digest as it is built)."""
    ctx.whatif
    return (ctx.part_digest or {}).get("whatif_graph")


def _gaps_of(ctx: Context) -> _Gaps:
    """A part's gaps, split by what later parts may change: their work is launched after this
    part's last host call, so only gaps ending after it can hold work of theirs (queued
    behind this part's); and its own work before its span, which may fill gaps of the parts
    before. (A gap across the end of the part is whole in it: its span reaches to where the
    next part's work starts, and the gap's cause is read from that work's launch,
    ``TraceMeta.next_part_work``.)"""
    lo, _ = ctx.window
    trace = ctx.trace
    host_end = trace.cpu.select((pl.col("start_ns") + pl.col("dur_ns")).max()).item() if trace.cpu.height else None
    late = pl.col("end_ns") > (lo if host_end is None else host_end)
    gaps = ctx.gaps.select("device", "start_ns", "end_ns", "dur_ns", pl.col("cause").cast(pl.String))
    return _Gaps(
        inner=_a.gaps_by_cause(gaps.filter(~late)),
        late=gaps.filter(late).drop("dur_ns"),
    )


def _idle_by_cause(parts: list[_Part]) -> pl.DataFrame:
    """Idle gaps per cause (``cause``, ``n``, ``ns``) over the parts: each part's own, and
    its late gaps less the time later parts' GPU work ran in them."""
    out, later = [], {}
    for p in reversed(parts):
        if p.gaps is None:
            continue
        if p.gaps.inner.height:
            out.append(p.gaps.inner)
        for (device,), rows in (p.gaps.late.partition_by("device", as_dict=True).items() if p.gaps.late.height else ()):
            covered = later[device].covered_within(rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy()) if device in later else 0
            left = rows.select("cause", (pl.col("end_ns") - pl.col("start_ns") - covered).alias("ns"))
            out.append(left.filter(pl.col("ns") > 0).group_by("cause").agg(pl.len().alias("n"), pl.col("ns").sum()))
        for device, levels in (p.levels.head.items() if p.levels is not None else ()):
            work = levels["memset"]  # (all activity)
            later[device] = later[device].union(work) if device in later else work
    if not out:
        return pl.DataFrame(schema={"cause": pl.String, "n": pl.Int64, "ns": pl.Int64})
    return pl.concat([x.with_columns(pl.col("n").cast(pl.Int64), pl.col("ns").cast(pl.Int64)) for x in out], how="vertical_relaxed")


def _combined(parts: list[_Part], top: int, bare_step_ms: float | None) -> Report:
    gpu = any(p.has_gpu for p in parts)
    lo, hi = min(p.window[0] for p in parts), max(p.window[1] for p in parts)
    span = max(hi - lo, 0)
    breakdowns = _timeline.combined_breakdowns([p.levels for p in parts if p.levels is not None], span) if gpu else {}
    steps = (pl.concat([p.steps for p in parts if p.steps.height], how="vertical_relaxed").sort("device", "step")
             if any(p.steps.height for p in parts) else parts[0].steps)
    if gpu:  # (a part that launched nothing has host-side steps of no device: the others' devices have none there)
        steps = steps.filter(pl.col("device").is_not_null())
    memcpy = _memcpy.combined_memcpy_table([p.memcpy for p in parts])
    observer = None
    cost = _event_cost.combined([p.event_cost for p in parts if p.event_cost is not None])
    if gpu:
        per_step = [p.observer_steps for p in parts if p.observer_steps is not None]
        observer = _observer.from_steps(pl.concat(per_step, how="vertical_relaxed") if per_step else None, bare_step_ms, cost)
    summary = _a.summary_of((lo, hi), breakdowns, memcpy, steps, sum(p.step_count for p in parts), observer)
    # the what-if model over all parts' steps: their graphs replayed as one, as a whole analysis does
    whatif = None
    if gpu:
        with phase("what-if"):
            whatif = WhatIf.of_graph(concat([p.whatif_graph for p in parts], list(range(len(parts)))), bare_step_ms,
                                     observer.unprofiled_step_ms[0] if observer is not None else None,
                                     replay_cost_us(cost, bare_step_ms), replay_central_at(cost, bare_step_ms))  # fmt: skip
        for p in parts:
            p.whatif_graph = None  # (concatenated: the parts' own not held beside it)
    kernels = _kernels.combined_hot_kernels([p.kernels for p in parts], _quantiles.merge([p.kernel_ns for p in parts if p.kernel_ns is not None]),
                                            top, [p.kernel_modes for p in parts if p.kernel_modes is not None])
    idle: dict[str, Any] = {}
    between = 0  # GPU idle (ns, all devices) no part's gaps hold: before, after or between the parts' spans
    if gpu:
        devices = len(breakdowns)  # (every part's devices)
        by = _idle_by_cause(parts)
        between = max(sum(b.idle_ns for b in breakdowns.values()) - int(by["ns"].sum() or 0), 0)
        by = pl.concat([by, pl.DataFrame({"cause": ["unknown"], "n": [0], "ns": [between]})])
        idle = _a.idle_of(by.group_by("cause").agg(pl.col("n", "ns").sum()), devices)
    host_ops = pl.concat([p.host_ops for p in parts if p.host_ops.height] or [parts[0].host_ops], how="vertical_relaxed")
    host_ops = host_ops.group_by("name").agg(pl.col("count", "total_ns").sum()).sort("total_ns", "name", descending=[True, False])
    first = parts[0].report
    source = dict(first.source)
    events = sum(p.events for p in parts)
    source["inputs"] = [{**source["inputs"][0], "analysed_events": events, "parts": len(parts)}]
    missing = _missing(parts, gpu=gpu, steps=steps.height > 0 or bool(_steps_in_trace(parts)))
    findings = with_overlaps(_findings(parts, span, breakdowns, observer, whatif), whatif)
    summary["gain_per"] = "step" if summary.get("step_count") else "window"
    if (predicted := combined(findings, whatif)) is not None:
        summary["predicted"] = predicted
    elif whatif is not None and not whatif.available:
        summary["predicted"] = {"missing": whatif.why_not}
    return Report(
        source=source,
        device=next((p.report.device for p in parts if p.report.device.get("name")), first.device),
        summary=summary,
        findings=tuple(findings),
        kernels=tuple(_a.kernels_of(kernels)) if kernels.height else (),
        steps=tuple(_a.steps_of(steps, gpu)),
        memcpy=tuple(_a.memcpy_of(memcpy)),
        launch=_a.launch_of(_launch.combined([p.launch for p in parts if p.launch is not None])) if gpu else {},
        idle=idle,
        host_ops=tuple(_a.host_ops_of(host_ops)),
        ranges=tuple(_a.ranges_of(combined_range_tables([p.ranges for p in parts]))),
        missing=missing,
        notes=tuple(_notes(parts, events, between // max(len(breakdowns), 1))),
        memory=None,
        perf=None if (perf := combined_perf([p.perf for p in parts])) is None else perf.to_dict(),
    )


# said where no part holds a whole step, so the observer model has none
_UNCORRECTED = ("not estimated: no part holds a whole profiler step (each is longer than a part), so host and launch overhead "
                "are the idle seen in the trace, which the profiler's own cost inflates, and an unprofiled step time "
                "(--bare-step-ms) is not used; a --memory-budget that holds a few steps, or --steps, corrects for it")


def _findings(parts: list[_Part], span_ns: int, breakdowns: dict, observer, whatif=None) -> list[Finding]:
    """Each part's findings as the whole trace's (see the module doc); a finding with a fix
    to replay has its gain predicted again over all parts' steps (``whatif``)."""
    from proflab.rules.utilization import GPU_WORK, healthy_of

    found: dict[str, list[tuple[int, Finding]]] = {}
    for i, p in enumerate(parts):
        memory = set((p.report.memory or {}).get("findings", ()))  # (memory is not combined: said missing)
        for f in p.report.findings:
            if f.category != "healthy" and f.id not in memory:
                found.setdefault(f.id, []).append((i, f))
    # the host-side rules' gains decided over all parts' sums, as the whole analysis decides them
    decided = over_parts([p.host_sums for p in parts if p.host_sums is not None], observer, span_ns)
    out = []
    steps = [int(p.report.summary.get("step_count") or 0) for p in parts]
    total_steps = sum(steps)
    for fid, fs in found.items():
        at, best = max(fs, key=lambda x: (x[1].est_gain_ms, -x[0]))
        if best.fixes and whatif is not None and whatif.available:
            if fid in decided and not decided[fid][2]:
                continue  # its cause is gone without the profiler over the whole trace (``rules.host._material``)
            # the fix replayed over all parts' steps, as a whole analysis replays it
            best = repredicted(best, whatif)
            if best.est_gain_pct < MIN_GAIN_PCT and not reported_without_gain(best):
                continue
            gain_ms, pct, how = best.est_gain_ms, best.est_gain_pct, "its fix replayed over all parts' steps"
            sev = best.severity  # (a severity that follows its range's lower end stays so)
        elif fid in decided:
            gain_ns, denom, _ = decided[fid]
            gain_ns = min(gain_ns, denom) if denom > 0 else gain_ns
            if _pct(gain_ns, denom, 3) < MIN_GAIN_PCT:
                continue  # not material over the whole trace
            gain_ms, pct, how = gain_ns / 1e6 / max(total_steps, 1), _pct(gain_ns, denom, 2), "gain over all parts"
        elif total_steps and any((f.prediction or {}).get("per") == "step" for _, f in fs):
            gain_ms = sum(f.est_gain_ms * steps[i] for i, f in fs) / total_steps
            pct, how = sum(f.est_gain_pct * steps[i] for i, f in fs) / total_steps, "gain per step over all parts"
            if len(fs) < len(parts) and pct < MIN_GAIN_PCT:
                continue
        else:
            gain_ms, how = sum(f.est_gain_ms for _, f in fs), "gain summed"
            pct = _share(parts, fs, gain_ms, span_ns)
            if len(fs) < len(parts) and not _over_the_whole(fs, gain_ms, pct, span_ns):
                continue  # over the rules' floor only in the short span of its parts: not over the whole
        if not (best.fixes and whatif is not None and whatif.available):
            sev = severity(pct) if gain_ms > 0 else max((f.severity for _, f in fs), key=("info", "warning", "critical").index)
        evidence = {**best.evidence, "part": parts[at].label, "found_in_parts": f"{len(fs)} of {len(parts)}"}
        if "profiler_cost" in evidence and observer is None and _steps_in_trace(parts):
            evidence["profiler_cost"] = _UNCORRECTED
        title = f"{best.title} [figures of {parts[at].label}; found in {len(fs)} of {len(parts)} parts, {how}]"
        out.append(dataclasses.replace(best, title=title, severity=sev, evidence=evidence, est_gain_ms=gain_ms,
                                       est_gain_pct=round(pct, 2)))
    out.sort(key=lambda f: (-f.est_gain_ms, f.id))
    if breakdowns and not any(f.severity in ("critical", "warning") and f.id not in GPU_WORK for f in out):
        out.extend(healthy_of(breakdowns, span_ns, observer, out))
    return out


def _share(parts: list[_Part], fs: list[tuple[int, Finding]], gain_ms: float, span_ns: int) -> float:
    """A summed gain's share (%) of what its rule measures gains against: the analysed span,
    or for the host-side rules the loop's unprofiled time (``rules.host``: the parts' own
    denominators, each ``gain / share``, scaled from their parts' spans to the whole span)."""
    if span_ns <= 0:
        return 0.0
    mine = [(100.0 * f.est_gain_ms / f.est_gain_pct, (parts[i].window[1] - parts[i].window[0]) / 1e6)
            for i, f in fs if f.est_gain_pct > 0 and f.est_gain_ms > 0]
    denom, walls = sum(d for d, _ in mine), sum(w for _, w in mine)
    whole_ms = span_ns / 1e6 * (denom / walls if mine and walls > 0 else 1.0)
    return min(100.0 * gain_ms / whole_ms, 100.0) if whole_ms > 0 else 0.0


def _over_the_whole(fs: list[tuple[int, Finding]], gain_ms: float, pct: float, span_ns: int) -> bool:
    """Whether a finding of only some parts would pass its rule's floor over the whole span:
    a gain finding, each part's over ``MIN_GAIN_PCT``, by its summed gain's share ``pct``; a
    host-side verdict the profiler's cost may explain (``*_unconfirmed``, no gain), each over
    ``WARNING_PCT`` at the low end of that cost, by its summed idle without the profiler."""
    share = lambda ms: 100.0 * ms / (span_ns / 1e6) if span_ns > 0 else 0.0  # noqa: E731
    if gain_ms > 0:
        return not all(f.est_gain_pct >= MIN_GAIN_PCT for _, f in fs) or pct >= MIN_GAIN_PCT
    if all(f.id.endswith("_unconfirmed") for _, f in fs):
        idle = [f.evidence.get("idle_without_profiler_ms") for _, f in fs]
        if all(isinstance(x, list) and len(x) == 2 and isinstance(x[1], (int, float)) for x in idle):
            return share(sum(x[1] for x in idle)) >= WARNING_PCT
    return True


def _missing(parts: list[_Part], *, gpu: bool, steps: bool) -> tuple[Missing, ...]:
    """The signals the parts lack, less those another part has (a part of only host calls
    lacks GPU activity; one between profiler steps, the steps)."""
    present = {"GPU activity"} if gpu else set()
    present |= {"profiler steps"} if steps else set()
    got: dict[str, Missing] = {}
    for p in parts:
        for m in p.report.missing:
            if m.signal in present:
                continue
            prev = got.get(m.signal)
            got[m.signal] = m if prev is None else Missing(m.signal, prev.reason, tuple(dict.fromkeys((*prev.skipped, *m.skipped))))
    if any(p.report.memory is not None for p in parts):
        got["GPU memory over the whole trace"] = Missing(
            "GPU memory over the whole trace", "analysed in parts (--all-parts): each part's memory timeline is its own, and they are "
            "not combined; --steps / --window analyse the memory of one part", ("memory section",))
    return tuple(got.values())


def _parts_text(n: int) -> str:
    return "one part that fits" if n == 1 else f"{n} consecutive parts that each fit"


def _notes(parts: list[_Part], events: int, between_ns: int) -> list[str]:
    notes: list[str] = []
    for p in parts:
        notes.extend(n for n in p.report.notes if not n.startswith(_PART_NOTE) and n not in notes)
    first = parts[0].report.source["inputs"][0]
    whole, budget = first.get("events"), first.get("memory_budget_bytes")
    from proflab.readers.budget import size_text

    labels = [p.label for p in parts]
    shown = ", ".join(labels) if len(labels) <= 6 else f"{', '.join(labels[:3])}, ..., {', '.join(labels[-2:])}"
    notes.append(f"memory budget: analysed every event in {_parts_text(len(parts))} the budget"
                 f"{'' if budget is None else ' of ' + size_text(budget)} ({shown}): {events:,} events in all (the trace holds "
                 f"{whole:,}; a host event across a cut counts in each part it spans), combined into this report")
    notes.append("analysed in parts: times, counts and steps are summed over the parts; medians and percentiles of kernels and "
                 f"launches are within {100 * _quantiles.ALPHA:g} %; each finding is its parts' findings, its gain summed (of syncs, "
                 "host and launch overhead: decided over all parts' sums), its "
                 "title and evidence from the part where it gains most (evidence.part)"
                 + (f"; {ms(between_ns)} ms of GPU idle between parts is of unknown cause" if between_ns else ""))
    every = _steps_in_trace(parts)
    kept = sum(p.step_count for p in parts)
    if every is not None and kept < every:  # window parts: a step across a cut is whole in neither
        notes.append(f"{every - kept} of the trace's {every} profiler steps run across a cut between two time windows and are "
                     "in no part's steps (their events are analysed; a step longer than a part is why the cuts are windows)")
    if every and not kept and any(p.has_gpu for p in parts):
        notes.append(f"the profiler's own cost is {_UNCORRECTED}")
    few = min((p.step_count for p in parts if p.step_count), default=None)
    if few is not None and few < FEW_STEPS:
        notes.append(f"analysed in parts of as few as {few} profiler step{'s' if few > 1 else ''}: the gains of host and launch "
                     "overhead and of syncs are decided over all parts, but whether a part finds them at all, by medians over its "
                     "own steps, which so few may not share with the whole trace; a larger --memory-budget puts more steps in each part")
    left = sum(p.graph_left_out for p in parts)
    if left:
        notes.append(f"predicted gains replay the steps of {len(parts) - left} of the {len(parts)} parts, spread over the "
                     "trace (the others' step graphs were left out to hold the memory budget)")
    return notes
