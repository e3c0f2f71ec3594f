"""Launch statistics: how fast the host feeds the GPU.

``delay`` is GPU start minus the start of the host launch call (ns): large values mean work
queues up (healthy); values near the launch cost mean the GPU waits on each launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from proflab.analysis.timeline.calls import IS_CALL, call_names
from proflab.model import Trace

__all__ = ["LaunchStats", "LaunchSamples", "launch_stats", "launch_samples", "stats_of", "digest", "combined", "SHORT_KERNEL_NS"]

SHORT_KERNEL_NS = 5_000
_LAUNCH_CALL = r"LaunchKernel|cuLaunch|GraphLaunch|LaunchCooperative"


@dataclass(frozen=True)
class LaunchStats:
    """Units in names; ``None`` where the trace lacks the signal."""

    kernel_count: int
    median_kernel_ns: float | None
    short_kernel_pct: float | None  # share of kernels shorter than SHORT_KERNEL_NS
    launch_calls: int
    median_launch_call_ns: float | None  # host time inside one launch call
    median_delay_ns: float | None  # launch call start -> kernel start
    p90_delay_ns: float | None
    launches_per_step: float | None  # median over steps


@dataclass(frozen=True)
class LaunchSamples:
    """What launch statistics are read from (ns): every kernel's duration, every launch
    call's host time, every kernel's delay from its launch call, and launch calls per
    profiler step (None without steps)."""

    kernel_ns: pl.Series
    call_ns: pl.Series
    delay_ns: pl.Series
    per_step: pl.Series | None


def launch_stats(trace: Trace, kernel_rows: pl.DataFrame) -> LaunchStats:
    return stats_of(launch_samples(trace, kernel_rows))


def launch_samples(trace: Trace, kernel_rows: pl.DataFrame) -> LaunchSamples:
    k = kernel_rows
    calls = (
        trace.cpu.select("cat", "name", "start_ns", "dur_ns")
        .filter(IS_CALL & pl.col("name").is_in(call_names(trace.cpu, _LAUNCH_CALL).implode()))
        .select("start_ns", "dur_ns")
    )
    delay = (k["start_ns"] - k["launch_start_ns"]).drop_nulls() if k.height else pl.Series([], dtype=pl.Int64)
    per_step = None
    if trace.steps.height and calls.height:
        steps = trace.steps.sort("start_ns")
        assigned = (
            calls.select("start_ns")
            .sort("start_ns")
            .join_asof(steps, on="start_ns", strategy="backward")
            .filter(pl.col("start_ns") < pl.col("end_ns"))
        )
        per_step = steps.select("step").join(assigned.group_by("step").len(), on="step", how="left").fill_null(0)["len"]
    kernel_ns = k["dur_ns"] if k.height else pl.Series("dur_ns", [], dtype=pl.Int64)
    return LaunchSamples(kernel_ns, calls["dur_ns"], delay, per_step)


def stats_of(s: LaunchSamples) -> LaunchStats:
    k, calls, delay = s.kernel_ns, s.call_ns, s.delay_ns
    return LaunchStats(
        kernel_count=k.len(),
        median_kernel_ns=_f(k.median()) if k.len() else None,
        short_kernel_pct=100.0 * float((k < SHORT_KERNEL_NS).mean()) if k.len() else None,
        launch_calls=calls.len(),
        median_launch_call_ns=_f(calls.median()) if calls.len() else None,
        median_delay_ns=_f(delay.median()) if delay.len() else None,
        p90_delay_ns=_f(delay.quantile(0.9)) if delay.len() else None,
        launches_per_step=None if s.per_step is None else float(s.per_step.median()),
    )


def _f(v) -> float | None:
    return None if v is None else float(v)


def digest(s: LaunchSamples, steps: int = 0) -> dict:
    """What a part's launch statistics combine from (``report.combine``): counts, the
    samples as value counts (``analysis.quantiles``), and launch calls per step (``steps``
    zeros for a part of steps that launched nothing, where other parts' calls make it 0)."""
    from proflab.analysis.quantiles import sketch

    return {
        "idle_steps": steps if s.per_step is None else 0,
        "kernels": s.kernel_ns.len(),
        "short": int((s.kernel_ns < SHORT_KERNEL_NS).sum()),
        "calls": s.call_ns.len(),
        "kernel_ns": sketch(s.kernel_ns),
        "call_ns": sketch(s.call_ns),
        "delay_ns": sketch(s.delay_ns),
        "per_step": s.per_step,
    }


def combined(digests: list[dict]) -> LaunchStats:
    """Launch statistics of the parts' :func:`digest` as one: counts and launches per step
    exact, medians and the 90th percentile within ``quantiles.ALPHA``."""
    from proflab.analysis.quantiles import merge, quantile

    kernels, calls = sum(d["kernels"] for d in digests), sum(d["calls"] for d in digests)
    counts = {k: merge([d[k] for d in digests]) for k in ("kernel_ns", "call_ns", "delay_ns")}
    per_step = [d["per_step"] for d in digests if d["per_step"] is not None]
    if per_step:  # (steps of parts that launched nothing launched 0)
        per_step += [pl.Series([0] * d["idle_steps"], dtype=per_step[0].dtype) for d in digests if d.get("idle_steps")]
    return LaunchStats(
        kernel_count=kernels,
        median_kernel_ns=quantile(counts["kernel_ns"], 0.5) if kernels else None,
        short_kernel_pct=100.0 * sum(d["short"] for d in digests) / kernels if kernels else None,
        launch_calls=calls,
        median_launch_call_ns=quantile(counts["call_ns"], 0.5) if calls else None,
        median_delay_ns=quantile(counts["delay_ns"], 0.5),
        p90_delay_ns=quantile(counts["delay_ns"], 0.9, interpolation="nearest"),
        launches_per_step=float(pl.concat(per_step).median()) if per_step else None,
    )
