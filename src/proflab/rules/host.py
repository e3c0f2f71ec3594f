"""Idle GPU time the host caused: synchronisation, launch overhead, and host-side work.

All three read the classified idle gaps (``analysis.timeline.gaps``) on the device where they cost
most. The host's share of a gap is split by what the host was doing: dispatching operators
that launch kernels (``launch_bound``) or work that launches nothing (``host_bound``). Both
are judged against the loop without the profiler (``analysis.timeline.observer``): their gain is the
idle that survives the largest plausible profiler cost, and a loop that is GPU-bound when
not profiled gets no warning. ``sync_bound`` owns the idle that follows a sync's return.

``unfused_elementwise`` is the GPU-bound side of launch_bound's elementwise part: an eager step
that is not launch-bound (by launch_bound's own split) whose GPU work is in good part
memory-bound kernels (pointwise, casts and copies, dropout, reductions, normalisation,
softmax: ``analysis.whatif.fixes.FUSIBLE_KERNEL``, by the kernel's name) between library
kernels (GEMM, attention, convolution: ``LIBRARY_KERNEL``, which stay). Its gain is the step
replayed with the ``compile`` fix: each chain's pointwise kernels fused into its reductions,
the fused kernels moving the chain's outside reads and writes only, a range the trace's names
cannot narrow (``FUSED_REST``). Where the step is launch-bound, launch_bound's elementwise
part names the same fix and this finding is not made.
"""

from __future__ import annotations

import dataclasses
import re
import weakref

import numpy as np
import polars as pl

from proflab.analysis.timeline.calls import IS_CALL, call_names
from proflab.analysis.timeline.compiled import in_spans
from proflab.analysis.context import Context
from proflab.analysis.timeline.intervals import IntervalSet
from proflab.analysis.timeline.gaps import LAUNCH_GAP_NS
from proflab.analysis.timeline.memcpy import pageable_host_copies, reference_link
from proflab.analysis.timeline import observer as _observer
from proflab.analysis.timeline.threads import ThreadClock
from proflab.analysis.whatif.fixes import FUSIBLE_KERNEL, LIBRARY_KERNEL, REDUCTION_KERNEL
from proflab.analysis.whatif.graph import LAUNCH
from proflab.model import Trace
from proflab.model.findings import Finding, Fix
from proflab.rules._common import MIN_GAIN_PCT, WARNING_PCT, gain_finding, keep, ms, pct, predicted, steps_in_window, us, with_try

__all__ = ["sync_bound", "launch_bound", "unfused_elementwise", "host_bound", "sync_copy_apis", "part_sums", "over_parts", "pinned_gbps"]

_SKIP = ("GPU idle-gap causes",)
# the recorded host events a stretch of host work holds (beside Python frames)
_HOST_EVENT_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")


def _gaps_of(trace: Trace, ctx: Context, causes: tuple[str, ...]) -> tuple[pl.DataFrame, int] | None:
    """Gaps of these causes on the device where they cost most, and their total (ns)."""
    if not trace.has_gpu:
        return None
    if not ctx.has_launch_links:
        ctx.note_missing(
            "host launch calls",
            "the trace has no CUDA runtime/driver events with correlation ids, so idle gaps "
            "cannot be tied to what the host was doing",
            *_SKIP,
        )
        return None
    g = ctx.gaps.filter(pl.col("cause").is_in(causes))
    if g.height == 0:
        return None
    per_dev = g.group_by("device").agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True)
    device = per_dev["device"][0]
    return g.filter(pl.col("device") == device), int(per_dev["dur_ns"][0])


def _steps(g: pl.DataFrame) -> list[int]:
    return sorted(int(s) for s in g["step"].drop_nulls().unique())


def _idle_pct_of_busy(ctx: Context, device: int) -> float:
    b = ctx.device_breakdowns.get(device)
    return round(b.busy_pct, 1) if b else 0.0


def _step_busy(ctx: Context, device: int) -> dict[int, int]:
    t = ctx.step_table.filter(pl.col("device") == device)
    return dict(zip(t["step"].to_list(), t["busy_ns"].to_list()))


def _sync_claim(ctx: Context, sync_gaps: pl.DataFrame) -> int:
    """What removing the syncs can win back (ns): per step, their idle but no more than the
    step's GPU work, which is all the host's work after them could have overlapped."""
    return _claimed(*_sync_sums(ctx, sync_gaps), ctx.observer)


def _sync_sums(ctx: Context, sync_gaps: pl.DataFrame) -> tuple[int, int, int]:
    """The sync idle per step capped at the step's GPU work, summed (ns); the steps with sync
    idle; and their GPU work (ns): sums over steps, so a trace analysed in parts adds its
    parts' (``report.combine``)."""
    if sync_gaps.height == 0:
        return 0, 0, 0
    busy = _step_busy(ctx, int(sync_gaps["device"][0]))
    per_step = sync_gaps.group_by("step").agg(pl.col("dur_ns").sum())
    capped = int(sum(min(d, busy.get(s, d)) if s is not None else d for s, d in per_step.iter_rows()))
    steps = per_step["step"].drop_nulls().to_list()
    return capped, len(steps), sum(busy.get(s, 0) for s in steps)


def _claimed(capped: int, steps: int, cap: int, obs) -> int:
    """The syncs' claim (``_sync_claim``) from their sums (``_sync_sums``) and the observer."""
    if obs is not None and obs.source == "measured" and steps:
        # A measured unprofiled step holds the syncs' whole cost: their idle and the refill of
        # the drained queue after each (the GPU runs kernel by kernel until the host is ahead
        # again), which the profiled trace cannot separate from its own slowness. The syncs
        # claim the measured excess first, up to the GPU work of their steps.
        return max(capped, int(min(obs.host_excess_ms_lo * 1e6 * steps, cap)))
    return capped


def sync_bound(trace: Trace, ctx: Context) -> list[Finding]:
    """Idle that follows a synchronising call's return is the sync's cost: without the sync,
    the host's work after it (logging, the next batch, the relaunch) would have run while the
    GPU was still busy. What removing it can win back per step is that idle, but no more than
    the GPU work of the step the host work could have overlapped."""
    found = _gaps_of(trace, ctx, ("sync",))
    if not found:
        return []
    g, total = found
    device = int(g["device"][0])
    gain = _sync_claim(ctx, g)
    obs = ctx.observer
    # shares of the loop as it runs without the profiler, where that is known or estimated
    denom = int(obs.unprofiled_step_ms[1] * 1e6 * obs.steps) if obs is not None else ctx.wall_ns
    replayed = ctx.whatif.available
    if not replayed and pct(gain, denom, 3) < MIN_GAIN_PCT:
        return []
    # the operators of these syncs only (a deduplication of every operator cost 75 ms of a
    # 1.6 M event trace's analysis)
    ids = g.get_column("sync_external_id").drop_nulls().unique().implode()
    ops = (
        trace.cpu.select("cat", "external_id", "name")
        .filter((pl.col("cat") == "cpu_op") & pl.col("external_id").is_in(ids))
        .select(pl.col("external_id").alias("sync_external_id"), pl.col("name").alias("op"))
        .unique("sync_external_id", keep="first")
    )
    by_call = (
        g.join(ops, on="sync_external_id", how="left")
        .group_by("sync_name", "op")
        .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("idle_ns"))
        .sort("idle_ns", descending=True)
    )
    lines = ctx.frames.top_lines(g.select("tid", pl.col("start_ns").alias("t_ns")))
    after = _host_activity(trace, g, only=ctx.host_only) or _host_activity(trace, g)
    # the program's own line the host was on midway through the idle (with stacks)
    mid = g.filter(pl.col("launch_start_ns").is_not_null()).select(
        "tid", ((pl.col("start_ns") + pl.col("launch_start_ns")) // 2).alias("t_ns")
    )
    after_lines = ctx.frames.top_lines(mid)
    n_steps = g["step"].drop_nulls().n_unique()
    evidence = {
        "sync_idle_ms": ms(total),
        "sync_gaps": g.height,
        "syncs_per_step": round(g.height / n_steps, 1) if n_steps else None,
        "median_gap_us": us(g["dur_ns"].median()),
        "idle_pct_of_window": pct(total, ctx.wall_ns),
        "gpu_busy_pct": _idle_pct_of_busy(ctx, device),
        "calls": [
            {"call": r["sync_name"], "op": r["op"], "count": r["count"], "idle_ms": ms(r["idle_ns"])}
            for r in by_call.head(5).iter_rows(named=True)
        ],
        "host_after_sync": after[:5],
        "lines_after_sync": after_lines,
        **_observer_evidence({"observer": obs}),
    }
    top = by_call.row(0, named=True)
    what = f"{top['op']} ({top['sync_name']})" if top["op"] else top["sync_name"]
    busy_after = [a for a in after if a["pct_of_gap_time"] >= 30 and a["name"] != "(outside operators)"]
    if busy_after:
        then = f"; the host then runs {busy_after[0]['name']}"
    elif after_lines:
        then = f"; the host then runs {after_lines[0]}"
    elif after and after[0]["name"] == "(outside operators)":
        then = "; the host then runs Python outside any recorded operator"
    else:
        then = ""
    fix = (
        f"Remove the per-step synchronisation ({what}"
        + (f", at {lines[0]}" if lines else "")
        + "): keep running values on the GPU and read them every N steps (or with a non_blocking copy into "
        "pinned memory and an event), drop torch.cuda.synchronize() outside timing code, and move the host work "
        "that follows the sync (logging, metrics) after the next step's launches or to another thread."
    )
    f = gain_finding(
        "sync_bound",
        gain,
        denom or ctx.wall_ns,
        title=f"Host synchronisation drains the GPU: {g.height} syncs leave it idle {ms(total, 2)} ms "
        f"({pct(total, ctx.wall_ns)}% of the window); top: {what}{then}",
        evidence=evidence,
        fix=fix,
        where={"steps": _steps(g), "ops": [o for o in by_call["op"].drop_nulls().unique(maintain_order=True).head(5)], "lines": lines},
        assumption="without the syncs the host runs ahead and its work after them overlaps the GPU work; "
        "at most the step's GPU work can hide it",
    )
    f = predicted(f, ctx, Fix("remove_syncs", label="no per-step synchronisation"))
    return keep(f, ctx)


# Kernels that fuse: elementwise and reduction chains torch.compile turns into one kernel.
_ELEMENTWISE = r"elementwise_kernel|vectorized_elementwise|unrolled_elementwise|reduce_kernel|index_elementwise"
_FUSED_OPTIMIZER = r"multi_tensor_apply|Fused|fused_adam|fused_sgd"


# launch_bound and host_bound share one split per analysis context
_SPLITS: weakref.WeakKeyDictionary[Context, dict | None] = weakref.WeakKeyDictionary()


def _host_split(trace: Trace, ctx: Context) -> dict | None:
    if ctx not in _SPLITS:
        _SPLITS[ctx] = _split_host_idle(trace, ctx)
    return _SPLITS[ctx]


def _split_host_idle(trace: Trace, ctx: Context) -> dict | None:
    """Host-caused idle (gaps of cause host or launch) split into op dispatch that launches
    kernels and host work that launches nothing, corrected for the profiler's own cost."""
    found = _gaps_of(trace, ctx, ("host", "launch", "sync"))
    if not found:
        return None
    g, total = found
    g = g.filter(pl.col("tid").is_not_null() & pl.col("launch_start_ns").is_not_null())
    # A sync's idle beyond the GPU work of its step is more than removing the sync can hide
    # (sync_bound claims the rest): that part is the host's work after the sync.
    if g.height and (g["cause"] == "sync").any():
        busy = _step_busy(ctx, int(g["device"][0]))
        sync_idle = g.filter(pl.col("cause") == "sync").group_by("step").agg(pl.col("dur_ns").sum().alias("_si"))
        keep = sync_idle.with_columns(
            pl.col("step").replace_strict(busy, default=0, return_dtype=pl.Int64).alias("_b")
        ).with_columns(((pl.col("_si") - pl.col("_b")).clip(lower_bound=0) / pl.col("_si")).alias("_r"))
        g = g.join(keep.select("step", "_r"), on="step", how="left").with_columns(
            pl.when(pl.col("cause") == "sync").then((pl.col("dur_ns") * pl.col("_r").fill_null(0)).cast(pl.Int64))
            .otherwise(pl.col("dur_ns")).alias("dur_ns")
        ).drop("_r").filter(pl.col("dur_ns") > 0)
    if g.height == 0:
        return None
    # The host side of each gap, [gap start, relaunch), is dispatch (launch overhead:
    # operators, the framework's Python between them) except where the host was in work
    # that launches nothing: an annotation that launched nothing (a DataLoader's __next__,
    # the program's record_function around I/O) or a long stretch outside any recorded event
    # (sleep, I/O, the program's own Python). A short gap (cause "launch") is dispatch. A gap
    # such work holds for at least half its host side is host_bound's whole: the dispatch
    # that ends a stall is the relaunch after it, not launch overhead, and one gap is not
    # claimed by both findings (a 20 ms stretch of Python was once host_bound's and its last
    # 45 us of dispatch launch_bound's, "the same gaps claimed twice").
    quiet = ctx.host_only
    clock = ThreadClock([g["tid"], quiet["tid"]], [g["start_ns"], g["launch_start_ns"], quiet["start_ns"], quiet["end_ns"]])
    host_only = IntervalSet.from_spans(clock.key(quiet["tid"], quiet["start_ns"]), clock.key(quiet["tid"], quiet["end_ns"]))
    w0, w1 = clock.key(g["tid"], g["start_ns"]), clock.key(g["tid"], g["launch_start_ns"])
    f = 1.0 - np.clip(host_only.covered_within(w0, w1) / np.maximum(w1 - w0, 1), 0.0, 1.0)
    f = np.where(f <= 0.5, 0.0, f)
    f = np.where(g["cause"].cast(pl.String).to_numpy() == "launch", 1.0, f)
    held = np.flatnonzero(f < 1.0)
    # the host events on the gaps' threads inside the host side of a gap that work launching
    # nothing holds: what the profiler recorded in that work. Only those whose start falls in
    # such a gap on any thread are taken and placed on the clock (inside a gap, they are within
    # its span): all of a 1 GB trace's 1.8 M host events and their keys added 85 MiB to the
    # analysis's peak here
    held_spans = IntervalSet.from_spans(g["start_ns"].to_numpy()[held], g["launch_start_ns"].to_numpy()[held])
    in_any = held_spans.contains(trace.cpu.get_column("start_ns").to_numpy())
    ev = trace.cpu.select("tid", "start_ns", "cat").filter(
        pl.Series(in_any) & pl.col("tid").is_in(g["tid"].unique().implode())
        & pl.col("cat").is_in(("python_function", *_HOST_EVENT_CATS))
    ).select("tid", "start_ns", (pl.col("cat") == "python_function").alias("python"))
    del in_any
    dur = g["dur_ns"].to_numpy()
    # The dispatch before a pageable copy is the copy's own host side (its staging, the
    # operator that makes it): pageable_memcpy's, which pinning removes, not launch overhead.
    pageable = g["correlation"].is_in(pageable_host_copies(trace)["correlation"].drop_nulls().implode()).fill_null(False).to_numpy()
    g = g.with_columns(pl.Series("launch_ns", np.where(pageable, 0.0, dur * f)), pl.Series("host_ns", dur * (1.0 - f)))
    launch_obs, host_obs = float(g["launch_ns"].sum()), float(g["host_ns"].sum())
    # The idle that work launching nothing holds is the program's at any profiler cost but
    # that of the events recorded inside it (at the largest per-event cost): its floor.
    windows = IntervalSet.from_spans(w0[held], w1[held])
    k = clock.key(ev["tid"], ev["start_ns"])
    inside = host_only.contains(k)
    inside &= windows.contains(k)
    py = ev["python"].to_numpy()
    recorded_ns = (np.count_nonzero(inside & ~py) * ctx.event_cost.hi_us + np.count_nonzero(inside & py) * _observer.PYTHON_COST_US[1]) * 1e3
    sums = {"host": host_obs, "launch": launch_obs, "steps": set(g["step"].drop_nulls().to_list()),
            "sync": _sync_sums(ctx, found[0].filter(pl.col("cause") == "sync")),
            "host_floor": max(host_obs - recorded_ns, 0.0)}
    return {"gaps": g, "total": total, **_host_launch(sums, ctx.observer, ctx.wall_ns), "sums": sums}


def _host_launch(sums: dict, obs, wall_ns: int) -> dict:
    """The host- and launch-caused idle at the low and high end of the profiler's cost
    (``lo``, ``hi``: ns), what was observed, the observer, what shares are taken of
    (``denom``) and the steps, from the split's sums (``sums``: observed ``host`` and
    ``launch`` idle, the gaps' ``steps``, the syncs' ``_sync_sums``): sums over steps, so a
    trace analysed in parts decides from its parts' sums as a whole analysis does
    (``report.combine``)."""
    host_obs, launch_obs = sums["host"], sums["launch"]
    steps = max(len(sums["steps"]), 1)
    if obs is None:
        lo = {"host": host_obs, "launch": launch_obs}
        hi, denom = dict(lo), wall_ns
    else:
        # Host work that launches nothing is taken as real (the profiler records little of
        # it); the profiler's cost falls on dispatch, so the launch part absorbs the correction.
        # The excess over the GPU work includes what the syncs cost; sync_bound claims that.
        claimed = _claimed(*sums["sync"], obs)
        # A host stall claims all the idle it holds: the estimated excess, unprofiled host work
        # over GPU work, lets the GPU's work overlap the host's, which a sync between them
        # forbids; the stall's idle less its recorded events' cost is there at any profiler
        # cost. A measured step's excess is the bare loop's idle itself and bounds it.
        floor = sums.get("host_floor", 0.0) if obs.source != "measured" else 0.0

        def split(excess_ms: float) -> dict[str, float]:
            e = min(max(excess_ms * 1e6 * steps - claimed, 0.0), host_obs + launch_obs)
            h = min(host_obs, max(e, floor))
            return {"host": h, "launch": min(launch_obs, max(e - h, 0.0))}

        lo, hi = split(obs.host_excess_ms_lo), split(obs.host_excess_ms_hi)
        denom = int(obs.unprofiled_step_ms[1] * 1e6 * steps) or wall_ns
    return {"observed": {"host": host_obs, "launch": launch_obs}, "lo": lo, "hi": hi, "observer": obs, "denom": denom, "steps": steps}


def part_sums(ctx: Context) -> dict:
    """What the host-side rules decide from, as sums over steps, for a part of a trace
    analysed in parts (``report.combine``, which decides over all parts' sums with
    :func:`over_parts`): the host split's (``_split_host_idle``) and sync_bound's gaps'."""
    split = _host_split(ctx.trace, ctx)
    found = _gaps_of(ctx.trace, ctx, ("sync",))
    return {"split": None if split is None else split["sums"], "sync": _sync_sums(ctx, found[0]) if found else None}


def over_parts(sums: list[dict], obs, wall_ns: int) -> dict[str, tuple[float, int, bool]]:
    """Per host-side rule, its gain (ns, at the conservative end), what its share is taken
    of (ns) and whether its cause is still there without the profiler at its lowest plausible
    cost (what a replayed finding needs, ``_material``), decided from the parts'
    :func:`part_sums` and the whole trace's observer as a whole analysis decides them: the
    profiler's correction is a median per step times the steps, capped by what was observed,
    which a sum of per-part decisions is not."""
    out: dict[str, tuple[float, int, bool]] = {}
    syncs = [s["sync"] for s in sums if s["sync"] is not None]
    if syncs:
        denom = int(obs.unprofiled_step_ms[1] * 1e6 * obs.steps) if obs is not None else wall_ns
        claimed = float(_claimed(*map(sum, zip(*syncs)), obs))
        out["sync_bound"] = (claimed, denom or wall_ns, claimed > 0)
    splits = [s["split"] for s in sums if s["split"] is not None]
    if splits:
        both = {"host": sum(s["host"] for s in splits), "launch": sum(s["launch"] for s in splits),
                "host_floor": sum(s.get("host_floor", 0.0) for s in splits),
                "steps": set().union(*(s["steps"] for s in splits)), "sync": tuple(map(sum, zip(*(s["sync"] for s in splits))))}
        split = _host_launch(both, obs, wall_ns)
        for part in ("host", "launch"):
            out[f"{part}_bound"] = (split["lo"][part], split["denom"], _still_there(split, part))
    return out


def _observer_evidence(split: dict) -> dict:
    obs = split["observer"]
    if obs is None:
        return {"profiler_cost": "not estimated: the trace has no GPU-side steps"}
    u0, u1 = obs.unprofiled_step_ms
    return {
        "unprofiled_step_ms": round(u0, 3) if obs.source == "measured" else [round(u0, 3), round(u1, 3)],
        "unprofiled_step_source": obs.source,
        "gpu_work_per_step_ms": round(obs.gpu_work_ms, 3),
        "profiled_step_ms": round(obs.gpu_step_ms, 3),
        "profiler_cost_per_step_ms": [round(obs.profiler_cost_ms_lo, 3), round(obs.profiler_cost_ms_hi, 3)],
    }


def _still_there(split: dict, part: str) -> bool:
    """Whether the split's ``part`` of the host's idle is material without the profiler at
    its lowest plausible cost: what a finding whose gain the replay predicts needs."""
    return split["observed"][part] > 0 and pct(split["hi"][part], split["denom"], 3) >= MIN_GAIN_PCT


def _material(trace: Trace, ctx: Context, part: str, category: str, what: str) -> tuple[dict | None, list[Finding]]:
    """The host split when ``part`` is material at the conservative end; otherwise None and
    the unconfirmed info finding, if the part is material only at the low profiler cost."""
    split = _host_split(trace, ctx)
    if split is None:
        return None, []
    if ctx.whatif.available:
        # the replay decides what fixing it saves (``predicted``), of a cause still there
        # without the profiler at its lowest plausible cost: a fix's other savings (fusion's
        # fewer bytes) are not this cause's
        return (split, []) if _still_there(split, part) else (None, [])
    if pct(split["lo"][part], split["denom"], 3) >= MIN_GAIN_PCT:
        return split, []
    return None, _maybe(category, split, part, ctx, f"{what} {ms(split['observed'][part], 2)} ms in this trace")


def _maybe(category: str, split: dict, part: str, ctx: Context, title: str) -> list[Finding]:
    """A part that is material only at the low end of the profiler's cost: an info finding
    that says so, with no claimed gain — the verdict does not survive the correction."""
    hi = split["hi"][part]
    obs = split["observer"]
    if obs is None or pct(hi, split["denom"], 3) < WARNING_PCT:
        return []
    return [
        gain_finding(
            category,
            0,
            ctx.wall_ns,
            id=f"{category}_unconfirmed",
            title=title + f"; the profiler's own cost ({obs.profiler_cost_ms_lo:.1f}-{obs.profiler_cost_ms_hi:.1f} ms "
            f"per step here) may account for all of it: without it the loop is GPU-bound or close",
            evidence={"observed_idle_ms": ms(split["observed"][part]), "idle_without_profiler_ms": [0.0, ms(hi)], **_observer_evidence(split)},
            fix="Time the loop without the profiler (proflab run does, outside its window; or pass the measured "
            "step time with --bare-step-ms) before acting on this; profile with record_shapes and with_stack off.",
            where={"steps": _steps(split["gaps"])},
            assumption="a host-side finding must survive the largest plausible profiler cost; this one does not",
        )
    ]


def launch_bound(trace: Trace, ctx: Context) -> list[Finding]:
    """Idle while the host dispatches operators that launch kernels: per-kernel launch and
    dispatch cost above the kernels' own time. One finding, broken down by what the trace
    shows: a per-parameter optimizer, elementwise chains torch.compile would fuse, and the
    remaining many small launches a CUDA graph would replay at once."""
    split, unconfirmed = _material(trace, ctx, "launch", "launch_bound", "Launch overhead leaves the GPU idle")
    if split is None:
        return unconfirmed
    gain = split["lo"]["launch"]
    g = split["gaps"].filter(pl.col("launch_ns") > 0)
    ls = ctx.launch_stats
    parts = _launch_parts(trace, ctx, g)
    device = int(g["device"][0])
    lines = ctx.frames.top_lines(g.select("tid", pl.col("launch_start_ns").alias("t_ns")))
    evidence = {
        "launch_idle_ms": ms(gain),
        "launch_idle_ms_range": [ms(gain), ms(split["hi"]["launch"])],
        "observed_launch_idle_ms": ms(split["observed"]["launch"]),
        "gaps": g.height,
        "median_gap_us": us(g["dur_ns"].median()),
        "gpu_busy_pct": _idle_pct_of_busy(ctx, device),
        "kernels": ls.kernel_count,
        "median_kernel_us": us(ls.median_kernel_ns),
        "kernels_under_5us_pct": None if ls.short_kernel_pct is None else round(ls.short_kernel_pct, 1),
        "launches_per_step": ls.launches_per_step,
        "median_launch_call_us": us(ls.median_launch_call_ns),
        "breakdown": [{k: v for k, v in p.items() if k != "fix"} for p in parts],
        **_observer_evidence(split),
    }
    top = parts[0]["what"] if parts else "many small launches"
    fix = " ".join(f"{p['what'][0].upper()}{p['what'][1:]} ({p['share_pct']}% of it): {p['fix']}." for p in parts) or (
        "Capture the step in a CUDA graph (torch.compile(mode='reduce-overhead') or torch.cuda.graphs)."
    )
    if ctx.compiled.compiled:
        evidence["compiled"] = _compiled_evidence(ctx)
    # each part's own fix, replayed; the finding's gain is its first part's fix (the one its title names)
    w = ctx.whatif
    for p in parts:
        as_named = p.pop("as_named", None)  # the fix as the part names it, where it does more than remove launches
        if w.available:
            pred = w.predict(p["whatif"])
            p["predicted_gain_ms"], p["predicted_gain_pct"] = round(pred.gain_ms, 3), pred.gain_pct
            p["predicted_gain_range_ms"] = [round(x, 3) for x in pred.gain_range_ms]
            if as_named:
                # its middle (the fusion's middle with the forward and backward graphed) and its top (the
                # fusion at its most, the whole step graphed): two replays where predict's span takes six;
                # its low end no lower than the graphs' own (the fusion only adds to them)
                label, (fuse, graph) = as_named
                mid = w.predict_at(dataclasses.replace(fuse, factor=0.5), graph)
                whole = w.predict_at(dataclasses.replace(fuse, factor=0.0), dataclasses.replace(graph, target=""))
                p["as_named"] = {"fix": label, "predicted_gain_ms": round(mid.gain_ms, 3), "predicted_gain_range_ms": [
                    round(min(pred.gain_range_ms[0], mid.gain_range_ms[0]), 3),
                    round(max(whole.gain_range_ms[1], mid.gain_ms), 3)]}
    evidence["breakdown"] = [{k: v for k, v in p.items() if k not in ("fix", "whatif")} for p in parts]
    f = gain_finding(
        "launch_bound",
        gain,
        split["denom"],
        title="Launch-bound: the host dispatches "
        + (f"{round(ls.launches_per_step)} kernels a step" if ls.launches_per_step else f"{ls.kernel_count} kernels")
        + " (median "
        f"{us(ls.median_kernel_ns)} us each) slower than the GPU runs them; {ms(split['observed']['launch'], 2)} ms idle"
        + f" in this trace, mostly {top}",
        evidence=evidence,
        fix=fix,
        where={"steps": _steps(g), "ops": [p["op"] for p in parts if p.get("op")], "lines": lines},
        assumption="the dispatch/launch cost of these kernels is removed (fused, batched or graph-replayed)",
    )
    first = parts[0]["whatif"] if parts else _graph_fix(bool(ctx.compiled.compiled))
    fwbw = ("cuda_graph", "forward_backward")
    if w.available and any((x.kind, x.target) == fwbw for x in [first] + [p["whatif"] for p in parts]):
        evidence["cuda_graph_capture"] = _capture_evidence(ctx)
        f = dataclasses.replace(f, evidence=evidence, assumption=f.assumption + (
            "; a CUDA graph is predicted as a range: at its low end (its prediction) only the launches of each "
            "step's forward and backward replay, at its high end the whole step's ("
            + evidence["cuda_graph_capture"]["forward_backward"] + ")"))
    f = predicted(f, ctx, first)
    if parts and parts[0]["whatif"].kind == "fuse_optimizer":
        f = with_try(f, "fused-optimizer")
    elif parts and parts[0]["whatif"].target == "regions":
        f = with_try(f, "compile-mode=reduce-overhead")
    return keep(f, ctx) if w.available else [f]


def unfused_elementwise(trace: Trace, ctx: Context) -> list[Finding]:
    """An eager, GPU-bound step's memory-bound kernels (``FUSIBLE_KERNEL``) that torch.compile
    would fuse: their GPU time and count per step by class, and the step replayed with them
    fused (``compile``). Not made for a compiled program (launch_bound and graph_breaks say
    what its eager code costs), nor where the step is launch-bound (launch_bound's elementwise
    part names the same fix), nor without a replay (the fused time is a replayed range)."""
    if not trace.has_gpu or ctx.compiled.compiled or not ctx.whatif.available:
        return []
    split = _host_split(trace, ctx)
    if split is not None and _still_there(split, "launch"):
        return []
    k = ctx.kernel_time_by_name
    lib = k["name"].str.contains(LIBRARY_KERNEL)
    fus = k["name"].str.contains(FUSIBLE_KERNEL) & ~lib
    red = fus & k["name"].str.contains(REDUCTION_KERNEL)
    total = int(k["dur_ns"].sum())
    fus_ns = int(k.filter(fus)["dur_ns"].sum())
    if total == 0 or pct(fus_ns, total, 3) < MIN_GAIN_PCT:
        return []
    n = max(steps_in_window(ctx), 1)
    per = (lambda ns: ms(ns / n)) if steps_in_window(ctx) else ms
    top = k.filter(fus).sort("dur_ns", descending=True).head(5)
    evidence = {
        "fusible_kernel_ms_per_step": per(fus_ns),
        "fusible_kernels_per_step": round(int(k.filter(fus)["count"].sum()) / n, 1),
        "fusible_pct_of_gpu_work": pct(fus_ns, total),
        "reduction_norm_softmax_ms_per_step": per(int(k.filter(red)["dur_ns"].sum())),
        "pointwise_ms_per_step": per(int(k.filter(fus & ~red)["dur_ns"].sum())),
        "library_kernel_ms_per_step": per(int(k.filter(lib)["dur_ns"].sum())),
        "top_fusible_kernels": [{"kernel": r["name"][:120], "ms_per_step": per(r["dur_ns"])} for r in top.iter_rows(named=True)],
        "fused_time_model": "each chain between library kernels runs as its reductions (its longest kernel where it "
        "has none) plus none to all of the rest of its time: the chain's intermediates no longer go through memory; "
        "the trace's kernel names do not say how much of the rest the fused kernels still move",
    }
    f = gain_finding(
        "memory_bound",
        0,
        ctx.wall_ns,
        id="unfused_elementwise",
        title=f"Unfused memory-bound kernels: {evidence['fusible_pct_of_gpu_work']}% of the GPU work "
        f"({evidence['fusible_kernel_ms_per_step']} ms a step) is elementwise, cast, dropout, normalisation, "
        "softmax and reduction kernels, each reading and writing its tensors through memory",
        evidence=evidence,
        fix="Compile the model (torch.compile(model), or the framework's switch: TrainingArguments(torch_compile=True), "
        "Lightning's torch.compile of the module): Inductor fuses these kernels into a few that keep intermediates "
        "in registers, and leaves the GEMMs and attention to their libraries. Measure it with proflab compare of "
        "the runs before and after.",
        where={"ops": [r["name"][:80] for r in top.iter_rows(named=True)]},
        assumption="torch.compile fuses each chain of memory-bound kernels between library kernels; the fused "
        "kernels move the chain's outside reads and writes only (a range: the names do not give the bytes)",
    )
    f = predicted(f, ctx, Fix("compile", label="torch.compile"))
    return keep(f, ctx)


def _compiled_evidence(ctx: Context) -> dict:
    """What a launch-bound compiled program's launches are (per step where there are steps)."""
    c = ctx.compiled
    per = c.per_step if c.steps else (lambda n: n)
    return {
        "launches_in_regions_per_step": per(c.launches["in_regions"]),
        "launches_outside_regions_per_step": per(c.launches["outside"]),
        "graph_replays_per_step": per(c.launches["graph_replays"]),
        "kernel_ms_in_regions": round(c.kernel_ns["in_regions"] / 1e6, 3),
        "kernel_ms_outside_regions": round(c.kernel_ns["outside"] / 1e6, 3),
        "eager_ops_outside": [o["op"] for o in c.eager_ops],
    }


def _launch_parts(trace: Trace, ctx: Context, g: pl.DataFrame) -> list[dict]:
    """The launch idle by what launched the work ending each gap."""
    kern = trace.gpu.select("correlation", pl.col("name").alias("kname"), pl.col("dur_ns").alias("kdur_ns")).drop_nulls("correlation").unique("correlation")
    ops = ctx.kernel_ops.rename({"op": "kop"})
    g = g.join(ops, on="correlation", how="left").join(kern, on="correlation", how="left")
    opt = trace.cpu.select("cat", "tid", "name", "start_ns", "dur_ns").filter(
        pl.col("cat").is_in(["user_annotation", "cpu_op"]) & pl.col("name").str.starts_with("Optimizer.step#")
    ).select("tid", "name", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    in_opt = np.zeros(g.height, dtype=bool)
    opt_name = None
    if opt.height:
        clock = ThreadClock([g["tid"], opt["tid"]], [g["launch_start_ns"], opt["start_ns"], opt["end_ns"]])
        spans = IntervalSet.from_spans(clock.key(opt["tid"], opt["start_ns"]), clock.key(opt["tid"], opt["end_ns"]))
        k = clock.key(g["tid"], g["launch_start_ns"])
        in_opt = spans.contains(k)
        opt_name = opt["name"][0].split("#", 1)[1].rsplit(".", 1)[0]
    elem = g["kname"].fill_null("").str.contains(_ELEMENTWISE).to_numpy()
    # work that runs longer than the dispatch gap before it is not a small launch: the host
    # was slow to reach it (one operator's host time), which a CUDA graph replays away too
    long = (g["kdur_ns"].fill_null(0) >= np.maximum(g["dur_ns"], LAUNCH_GAP_NS)).to_numpy()
    w = g["launch_ns"].to_numpy()
    total = float(w.sum()) or 1.0

    def top_ops(mask: np.ndarray) -> list[str]:
        return g.filter(pl.Series(mask))["kop"].drop_nulls().value_counts(sort=True).head(3)["kop"].to_list()

    # a compiled program: launches from torch.compile's code are not compiled again; what it
    # leaves is capturing them (reduce-overhead), and the eager code outside its regions
    compiled = ctx.compiled.compiled
    in_reg = in_spans(ctx.regions[0], g["tid"], g["launch_start_ns"]) if compiled else np.zeros(g.height, dtype=bool)
    in_opt &= ~in_reg
    outside = " outside the compiled regions" if compiled else ""
    parts = []
    if in_opt.any():
        fused = bool(g.filter(pl.Series(in_opt))["kname"].drop_nulls().str.contains(_FUSED_OPTIMIZER).any())
        parts.append({
            "what": f"the optimizer step ({opt_name})" + ("" if fused else ", one parameter at a time"),
            "share_pct": round(100 * float(w[in_opt].sum()) / total, 1),
            "op": f"Optimizer.step#{opt_name}.step",
            "fix": ("it already runs multi-tensor kernels: use fused=True or capture it in a CUDA graph"
                    if fused else f"update all parameters at once with {opt_name}(..., foreach=True) or fused=True"),
            "whatif": Fix("fuse_optimizer", label=f"{opt_name}(fused=True)"),
        })
    if in_reg.any():
        parts.append({
            "what": "the compiled regions' own launches (torch.compile's generated code"
                    + (f": {ctx.compiled.per_step(ctx.compiled.launches['in_regions']):g} launches a step" if ctx.compiled.steps else "") + ")",
            "share_pct": round(100 * float(w[in_reg].sum()) / total, 1),
            "op": None,
            "fix": ("the program already compiles: capture its compiled regions in CUDA graphs with "
                    "torch.compile(..., mode='reduce-overhead'), which replays the compiled forward and backward "
                    "(the optimizer, loss and input pipeline outside them stay as they are); "
                    "a CUDA graph skip (dynamic shapes, CPU tensors, mutated inputs) keeps a region eager-launched"),
            "whatif": Fix("cuda_graph", target="regions", label="torch.compile(mode='reduce-overhead')"),
        })
    rest = ~in_opt & ~in_reg
    for mask, what, fix, whatif, as_named in (
        (rest & elem, "elementwise/reduction chains" + outside,
         ("bring them into the compiled code (compile the function that computes them, such as the loss) so "
          "Inductor fuses them" if compiled else "fuse them into a few kernels with torch.compile"),
         Fix("compile", label="compile the eager code" if compiled else "torch.compile"), None),
        (rest & ~elem & ~long, "many small launches" + outside,
         ("capture them in a CUDA graph (torch.cuda.graphs) or bring them into the compiled code" if compiled else
          "compile the model with torch.compile(model, mode='reduce-overhead'), which replays its forward and "
          "backward from CUDA graphs (the predicted range's low end: the optimizer, the batch fetch and the code "
          "after the backward stay eager), or capture the whole step in a CUDA graph (torch.cuda.graphs, with "
          "static inputs and a capturable optimizer) so it launches once (the range's high end); or batch the "
          "small tensors into larger ones"),
         _graph_fix(compiled), None if compiled else _REDUCE_OVERHEAD),
        (rest & ~elem & long, "slow dispatch of longer work" + outside,
         "the host spends this time inside these operators before their work reaches the GPU (record with "
         "with_stack=True to see the lines): make that host work cheaper, or capture the step in a CUDA graph "
         "so it is not repeated", _graph_fix(compiled), None),
    ):
        if mask.any():
            names = top_ops(mask)
            parts.append({
                "what": what + (f" ({', '.join(names)})" if names else ""),
                "share_pct": round(100 * float(w[mask].sum()) / total, 1),
                "op": names[0] if names else None,
                "fix": fix,
                "whatif": whatif,
                **({"as_named": as_named} if as_named else {}),
            })
    return sorted(parts, key=lambda p: -p["share_pct"])


def _graph_fix(compiled: bool) -> Fix:
    """The CUDA graph a launch-bound step's eager launches are replayed with: a compiled
    program's launches outside its regions; an eager one's forward and backward (what
    mode='reduce-overhead' captures), a range up to the whole step (a manual capture)."""
    if compiled:
        return Fix("cuda_graph", target="outside", label="CUDA graph")
    return Fix("cuda_graph", target="forward_backward", label="CUDA graphs of the forward and backward (to the whole step)")


# An eager program's many small launches: the part's gain is what a CUDA graph of its forward and
# backward replays away (the launch idle, the finding's own); the fix it names,
# torch.compile(model, mode='reduce-overhead'), is Inductor's fusion of the model as well, predicted
# beside it (``as_named``: on nanoGPT the graph alone 1.81 ms, with the fusion 2.97 ms, 1.81-4.14 to
# the whole step's graph, where that fix measured 4.14 ms)
_REDUCE_OVERHEAD = ("torch.compile(model, mode='reduce-overhead'): Inductor's fusion and CUDA graphs of the forward "
                    "and backward", (Fix("compile", label="torch.compile"), _graph_fix(False)))


def _capture_evidence(ctx: Context) -> dict:
    """Which launches an eager step's CUDA-graph prediction replays at its low end (the
    forward and backward) and its high end (the whole step), per step, and how the span was
    found."""
    g = ctx.whatif.graph
    if g is None:
        return {}
    inside = (g.call_step >= 0) & (g.call_kind == LAUNCH)
    n = max(len(g.steps), 1)
    fwbw = g.call_fwbw if g.call_fwbw is not None else ~g.call_optimizer
    return {
        "forward_backward": g.fwbw_how,
        "launches_per_step_forward_backward": round(float((inside & fwbw).sum()) / n, 1),
        "launches_per_step_whole_step": round(float(inside.sum()) / n, 1),
    }


_LOADER = r"(?i)dataloader|_next_data|__next__|collate"


def host_bound(trace: Trace, ctx: Context) -> list[Finding]:
    """Idle while the host does work that launches nothing: data loading, Python, sleeps, I/O
    (dispatch that launches kernels is launch_bound's)."""
    split, unconfirmed = _material(trace, ctx, "host", "host_bound", "Host work leaves the GPU idle")
    if split is None:
        return unconfirmed
    gain = split["lo"]["host"]
    g = split["gaps"].filter(pl.col("host_ns") > 0)
    device = int(g["device"][0])
    activity = _host_activity(trace, g, only=ctx.host_only)
    top = activity[0]["name"] if activity else None
    lines = ctx.frames.top_lines(g.select("tid", pl.col("start_ns").alias("t_ns")))
    if top and any(re.search(_LOADER, a["name"]) for a in activity[:2]):
        fix = (
            f"The input pipeline starves the GPU ({top}): use DataLoader(num_workers>0, pin_memory=True, "
            "persistent_workers=True, prefetch_factor=2-4), move heavy transforms into the workers or onto "
            "the GPU, and cache decoded data."
        )
    elif top and top != "(outside operators)":
        fix = (
            f"The host spends the idle in {top}, which launches no GPU work: move it off the critical path "
            "(after the next step's launches, a worker thread or process) or make it cheaper."
            + (f" It runs at {lines[0]}." if lines else "")
        )
    else:
        fix = (
            "The host spends the idle in Python outside any recorded operator"
            + (f" (mostly at {lines[0]})" if lines else " (record with with_stack=True to see the lines)")
            + ": move that work off the critical path or make it cheaper."
        )
    evidence = {
        "host_idle_ms": ms(gain),
        "host_idle_ms_range": [ms(gain), ms(split["hi"]["host"])],
        "observed_host_idle_ms": ms(split["observed"]["host"]),
        "gaps": g.height,
        "median_gap_ms": ms(g["dur_ns"].median()),
        "max_gap_ms": ms(g["dur_ns"].max()),
        "gpu_busy_pct": _idle_pct_of_busy(ctx, device),
        "host_activity_in_gaps": activity[:5],
        **_observer_evidence(split),
    }
    title = (
        f"Host-bound: the GPU waits {ms(split['observed']['host'], 2)} ms in {g.height} gaps while the host does work "
        f"that launches nothing" + (f", mostly {top}" if top else "")
    )
    f = gain_finding(
        "host_bound",
        gain,
        split["denom"],
        title=title,
        evidence=evidence,
        fix=fix,
        where={"steps": _steps(g), "ops": [a["name"] for a in activity[:5]], "lines": lines},
        assumption="the host work moves off the critical path (workers, prefetch), closing these gaps",
    )
    loader = bool(top and any(re.search(_LOADER, a["name"]) for a in activity[:2]))
    fixes = [Fix("remove_host_work", "loader", label="DataLoader workers")] if loader else [Fix("remove_host_work", "quiet", label="host work off the loop")]
    if loader:  # the fix names pin_memory too
        fixes.append(Fix("pin_copies", rate_gbps=pinned_gbps(ctx), label="pin_memory=True"))
    f = predicted(f, ctx, *fixes)
    if loader:
        f = with_try(f, "workers=4", "pin-memory", "persistent-workers")
    return keep(f, ctx) if ctx.whatif.available else [f]


def pinned_gbps(ctx: Context) -> float:
    """The rate pinned host-to-device copies reach (GB/s): the best measured in the trace,
    else the link's reference (``analysis.timeline.memcpy``)."""
    _, rows, _ = ctx.pinning
    h2d = [r["reference_gbps"] for r in rows if r["direction"] == "HtoD"]
    if h2d:
        return float(h2d[0])
    return float(reference_link(ctx.device_info.get("compute_major"))[1])


def _host_activity(trace: Trace, g: pl.DataFrame, only: pl.DataFrame | None = None) -> list[dict]:
    """What the launching thread was inside during the gaps (from each gap's start to the
    relaunch): names by overlapped time. ``only`` (tid, name, start_ns, end_ns) replaces the
    trace's operators and annotations, e.g. with the host-only spans."""
    gaps = g.filter(pl.col("tid").is_not_null() & pl.col("launch_start_ns").is_not_null()).select(
        "tid", pl.col("start_ns").alias("g0"), pl.col("launch_start_ns").alias("g1")
    )
    if gaps.height == 0:
        return []
    events = (
        trace.cpu.select("cat", "tid", "name", "start_ns", "dur_ns")
        .filter(
            pl.col("cat").is_in(["cpu_op", "user_annotation"])
            & ~pl.col("name").str.starts_with("ProfilerStep#")
            & pl.col("tid").is_in(gaps["tid"].unique().implode())
        )
        .select("tid", "name", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    )
    if only is not None:
        events = only.filter(pl.col("tid").is_in(gaps["tid"].unique().implode()))
    # Each event's overlap with the gaps of its thread is one prefix-sum lookup: the gap
    # windows, keyed per thread (ThreadClock), form one IntervalSet, and an event [e0, e1)
    # overlaps them by covered(e1) - covered(e0). Linear in gaps + events; a pairing of
    # gaps with events would keep gaps x long ranges (a `## backward ##` range spans
    # thousands of gaps on one thread).
    clock = ThreadClock([gaps["tid"], events["tid"]], [gaps["g0"], gaps["g1"], events["start_ns"], events["end_ns"]])
    windows = IntervalSet.from_spans(clock.key(gaps["tid"], gaps["g0"]), clock.key(gaps["tid"], gaps["g1"]))
    ov = windows.covered_within(clock.key(events["tid"], events["start_ns"]), clock.key(events["tid"], events["end_ns"]))
    total = windows.total_ns or 1
    agg = (
        events.select("name")
        .with_columns(pl.Series("ov", ov, dtype=pl.Int64))
        .filter(pl.col("ov") > 0)
        .group_by("name")
        .agg(pl.col("ov").sum().alias("ov_ns"))
        .sort(["ov_ns", "name"], descending=[True, False])
        .head(8)
    )
    return [
        {"name": r["name"], "overlap_ms": ms(r["ov_ns"]), "pct_of_gap_time": pct(r["ov_ns"], total)}
        for r in agg.iter_rows(named=True)
    ]


_SYNC_COPY_API = r"^(?:cudaMemcpy|cudaMemcpy[23]D|cudaMemcpyToSymbol|cudaMemcpyFromSymbol|cudaMemset|cudaMemset[23]D|cuMemcpy(?:DtoH|HtoD|DtoD|HtoA|AtoH)?|cuMemsetD\d+|hipMemcpy(?:WithStream|DtoH|HtoD|DtoD|2D|3D)?|hipMemset(?:D\d+|2D|3D)?)$"


def sync_copy_apis(trace: Trace, ctx: Context) -> list[Finding]:
    """Synchronous copy/memset APIs (cudaMemcpy, cudaMemset...): each blocks the host until the
    GPU is done. Reported by count and blocked host time; the GPU idle they cause, if any, is
    already in the sync_bound finding, so this one claims no gain of its own."""
    calls = trace.cpu.select("cat", "name", "tid", "start_ns", "dur_ns").filter(
        IS_CALL & pl.col("name").is_in(call_names(trace.cpu, _SYNC_COPY_API).implode())
    )
    if calls.height == 0:
        return []
    by_api = calls.group_by("name").agg(pl.len().alias("calls"), pl.col("dur_ns").sum().alias("host_ns")).sort("host_ns", descending=True)
    idle = ctx.gaps.filter(pl.col("sync_name").is_in(by_api["name"].implode()))["dur_ns"].sum() if trace.has_gpu else 0
    lines = ctx.frames.top_lines(calls.select("tid", pl.col("start_ns").alias("t_ns")))
    return [
        gain_finding(
            "sync_bound",
            0,
            ctx.wall_ns,
            id="sync_copy_apis",
            title=(
                f"Synchronous copy/memset APIs: {calls.height} calls ({', '.join(by_api['name'].head(3).to_list())}) "
                f"block the host for {ms(by_api['host_ns'].sum(), 2)} ms"
            ),
            evidence={
                "apis": [{"api": r["name"], "calls": r["calls"], "host_blocked_ms": ms(r["host_ns"])} for r in by_api.iter_rows(named=True)],
                "gpu_idle_after_them_ms": ms(idle),
            },
            fix=(
                "Use the async forms on a stream (cudaMemcpyAsync/cudaMemsetAsync; in PyTorch .to(device, non_blocking=True) "
                "from pinned memory, torch.zeros/fill_ on the GPU) and synchronise once where the result is needed."
            ),
            where={"ops": by_api["name"].head(5).to_list(), "lines": lines},
            assumption="the GPU idle they cause is counted in sync_bound; this finding claims no separate gain",
        )
    ]
