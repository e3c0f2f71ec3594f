"""Overall GPU utilisation: idle time no specific rule explains, and the healthy verdict."""

from __future__ import annotations

import polars as pl

from proflab.analysis.context import Context
from proflab.analysis.timeline.breakdown import low_stretches
from proflab.model import Trace
from proflab.model.findings import Finding
from proflab.rules._common import MIN_GAIN_PCT, WARNING_PCT, gain_finding, ms, pct

__all__ = ["low_utilization", "healthy", "LOW_BUSY_PCT", "GPU_WORK"]

LOW_BUSY_PCT = 80.0
_EXPLAINED = ("host", "sync", "launch")


def low_utilization(trace: Trace, ctx: Context) -> list[Finding]:
    if not trace.has_gpu or not ctx.device_breakdowns:
        return []
    device, b = min(ctx.device_breakdowns.items(), key=lambda kv: kv[1].busy_pct)
    if b.busy_pct >= LOW_BUSY_PCT:
        return []
    g = ctx.gaps.filter(pl.col("device") == device)
    by_cause = g.group_by("cause").agg(pl.col("dur_ns").sum()).sort("cause")
    by = {str(r["cause"]): int(r["dur_ns"]) for r in by_cause.iter_rows(named=True)}
    unexplained = b.idle_ns - sum(by.get(c, 0) for c in _EXPLAINED)
    gain_pct = pct(unexplained, ctx.wall_ns, 2)
    if gain_pct < MIN_GAIN_PCT:
        return []
    return [
        gain_finding(
            "low_utilization",
            unexplained,
            ctx.wall_ns,
            title=(
                f"GPU {device} busy only {b.busy_pct:.1f}% of {ms(b.wall_ns, 2)} ms; "
                f"{ms(unexplained, 2)} ms of idle has no host-side cause in the trace"
            ),
            evidence={
                "gpu_busy_pct": round(b.busy_pct, 1),
                "idle_ms": ms(b.idle_ns),
                "idle_by_cause_ms": {c: ms(v) for c, v in by.items()},
                "unexplained_idle_ms": ms(unexplained),
                "low_stretches": [
                    {"from_ms": ms(a - ctx.window[0]), "to_ms": ms(z - ctx.window[0]), "gpu_busy_pct": round(p, 1)}
                    for a, z, p in low_stretches(ctx.busy[device], *ctx.window)[:3]
                ],
            },
            fix=(
                "Idle with work already queued means GPU-side dependencies: check cross-stream waits "
                "(cudaStreamWaitEvent), serialised copies, and small batches; raise the batch size or overlap "
                "independent work on separate streams. If host events are missing, re-profile with CPU and CUDA "
                "activities so the host side can be diagnosed."
            ),
            where={"devices": [device]},
            assumption="the unexplained idle can be filled with useful work",
        )
    ]


GPU_WORK = ("unfused_elementwise",)


def healthy(trace: Trace, ctx: Context, findings: list[Finding]) -> list[Finding]:
    """The ``healthy`` verdict when no finding of lost GPU time reaches warning level (GPU work
    that could be smaller, ``unfused_elementwise``, is not a timeline problem: it stands beside it)."""
    if any(f.severity in ("critical", "warning") and f.id not in GPU_WORK for f in findings) or not trace.has_gpu:
        return []
    return healthy_of(ctx.device_breakdowns, ctx.wall_ns, ctx.observer, findings)


def healthy_of(breakdowns: dict, wall_ns: int, obs, findings: list[Finding]) -> list[Finding]:
    """The ``healthy`` finding from the breakdowns per device, the analysed span (ns) and
    the observer model (a trace analysed in parts: their combination, ``report.combine``)."""
    parts = []
    for device, b in breakdowns.items():
        parts.append(f"GPU {device} busy {b.busy_pct:.1f}%")
    title = f"No material timeline problem: {', '.join(parts)}; no cause of idle time reaches {WARNING_PCT:g}%"
    evidence = {
        "gpu_busy_pct_by_device": {str(d): round(b.busy_pct, 1) for d, b in breakdowns.items()},
        "wall_ms": ms(wall_ns),
        "minor_findings": [f.id for f in findings],
    }
    fix = "Nothing to change at the timeline level; profile the hot kernels next (proflab kernels)."
    inflated = obs is not None and obs.gpu_step_ms > 1.10 * obs.gpu_work_ms
    # The estimate's upper end is a host-limited loop: from this trace alone nobody can tell
    # (the same 22.3-28.4 ms range held a loop measured at 22.9 ms and one at 27.8 ms, one host
    # apart), so the verdict says so instead of sounding sure.
    unsure = obs is not None and obs.source == "estimated" and obs.unprofiled_step_ms[1] > 1.10 * obs.gpu_work_ms
    if inflated or unsure:
        u0, u1 = obs.unprofiled_step_ms
        evidence.update(
            gpu_work_per_step_ms=round(obs.gpu_work_ms, 3),
            profiled_step_ms=round(obs.gpu_step_ms, 3),
            unprofiled_step_ms=[round(u0, 3), round(u1, 3)],
            unprofiled_step_source=obs.source,
        )
    if unsure:
        up_to = 100.0 * (u1 - obs.gpu_work_ms) / u1
        title = (
            f"No confirmed timeline problem: {obs.gpu_work_ms:.1f} ms of GPU work per step, unprofiled step "
            f"{u0:.1f}-{u1:.1f} ms (estimated), so the host may leave the GPU waiting up to {up_to:.0f}% of each "
            "step; this trace cannot tell how much: measure the step without the profiler"
        )
        evidence["host_share_pct_possible"] = [0.0, round(up_to, 1)]
        fix = (
            "Measure the loop's step time without the profiler and pass it (proflab analyze --bare-step-ms MS; "
            "proflab run measures it itself): host and launch verdicts are then judged against it. "
            "If the GPU-side step is near the GPU work, profile the hot kernels next (proflab kernels)."
        )
    elif inflated:
        # The trace's idle is the profiler's: say so, with the numbers behind it.
        unprof = f"{u0:.1f} ms" if obs.source == "measured" else f"{u0:.1f}-{u1:.1f} ms (estimated)"
        title = (
            f"No material timeline problem without the profiler: {obs.gpu_work_ms:.1f} ms of GPU work per step, "
            f"unprofiled step {unprof}; the {obs.gpu_step_ms:.1f} ms steps of this trace are the profiler's own cost"
        )
    return [
        Finding(
            id="healthy",
            category="healthy",
            severity="info",
            title=title,
            evidence=evidence,
            est_gain_ms=0.0,
            est_gain_pct=0.0,
            fix=fix,
            where={},
            assumption="",
        )
    ]
