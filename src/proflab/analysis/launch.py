"""Launch statistics: how fast the host feeds the GPU.

``delay`` is GPU start minus the start of the host launch call (ns): large values mean work
queues up (healthy); values near the launch cost mean the GPU waits on each launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from proflab.model import Trace

__all__ = ["LaunchStats", "launch_stats", "SHORT_KERNEL_NS"]

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


def launch_stats(trace: Trace, kernel_rows: pl.DataFrame) -> LaunchStats:
    k = kernel_rows
    calls = (
        trace.cpu.select("cat", "name", "start_ns", "dur_ns")
        .filter(pl.col("cat").is_in(["cuda_runtime", "cuda_driver"]) & pl.col("name").str.contains(_LAUNCH_CALL))
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
        counts = steps.select("step").join(assigned.group_by("step").len(), on="step", how="left").fill_null(0)
        per_step = float(counts["len"].median())
    return LaunchStats(
        kernel_count=k.height,
        median_kernel_ns=_f(k["dur_ns"].median()) if k.height else None,
        short_kernel_pct=100.0 * float((k["dur_ns"] < SHORT_KERNEL_NS).mean()) if k.height else None,
        launch_calls=calls.height,
        median_launch_call_ns=_f(calls["dur_ns"].median()) if calls.height else None,
        median_delay_ns=_f(delay.median()) if delay.len() else None,
        p90_delay_ns=_f(delay.quantile(0.9)) if delay.len() else None,
        launches_per_step=per_step,
    )


def _f(v) -> float | None:
    return None if v is None else float(v)
