"""Steps as the GPU experiences them.

A ``ProfilerStep#N`` range is the host's view: when the host runs ahead (no sync in the
loop) its step ranges are far shorter than the step the GPU executes, and a DataParallel or
pipelined loop can show 6 ms host steps over 37 ms GPU steps. The GPU-side step *N* starts
when the GPU starts the first work launched during host step *N* (by any thread: backward
runs on autograd's own thread) and ends when step *N+1*'s work starts; the last step ends
with the last work launched inside it. That is the time per step the GPU experiences, and
what the loop's throughput follows.

Kineto's own ``gpu_user_annotation`` ProfilerStep spans cover only the kernels launched by
the thread that opened the range, so they are not used for this.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from proflab.model import Trace

__all__ = ["GPU_STEP_SCHEMA", "gpu_steps"]

GPU_STEP_SCHEMA = {
    "step": pl.Int64,
    "device": pl.Int32,
    "start_ns": pl.Int64,  # GPU side
    "end_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "cpu_start_ns": pl.Int64,  # the host's ProfilerStep range
    "cpu_dur_ns": pl.Int64,
    "launches": pl.Int64,  # GPU activities launched during the host step
}


def gpu_steps(trace: Trace, launches: pl.DataFrame) -> pl.DataFrame:
    """One row per (step, device) with GPU work: the GPU-side window of each host step.

    ``launches`` is ``gaps.launch_calls(trace)`` (correlation -> launch_start_ns). Steps
    whose work cannot be tied to a launch (no runtime events) are absent: callers fall back
    to the host ranges and say so."""
    steps = trace.steps.sort("start_ns")
    if steps.height == 0 or launches.height == 0 or not trace.has_gpu:
        return pl.DataFrame(schema=GPU_STEP_SCHEMA)
    work = (
        trace.gpu.select("device", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"), "correlation")
        .join(launches.select("correlation", "launch_start_ns"), on="correlation", how="inner")
        .sort("launch_start_ns")
    )
    s0 = steps["start_ns"].to_numpy()
    s1 = steps["end_ns"].to_numpy()
    t = work["launch_start_ns"].to_numpy()
    k = np.searchsorted(s0, t, side="right") - 1  # the last step that began at or before t
    inside = (k >= 0) & (t < s1[np.maximum(k, 0)])
    work = work.with_columns(pl.Series("k", np.where(inside, k, -1), dtype=pl.Int64)).filter(pl.col("k") >= 0)
    per = (
        work.group_by("device", "k")
        .agg(pl.col("start_ns").min().alias("first_ns"), pl.col("end_ns").max().alias("last_ns"), pl.len().alias("launches"))
        .sort("device", "k")
    )
    # A step's GPU window ends where the next step's work starts on that device; the last
    # step (or one followed by a step that launched nothing) ends with its own last work.
    nxt = pl.col("first_ns").shift(-1).over("device")
    adjacent = pl.col("k").shift(-1).over("device") == pl.col("k") + 1
    # a part of a trace analysed in parts: its last step ends where the next part's first starts
    after = {w.device: w.start_ns for w in trace.meta.next_part_work}
    if after:
        beyond = pl.col("device").replace_strict(list(after), list(after.values()), default=None, return_dtype=pl.Int64)
        nxt = pl.when(pl.col("k") == steps.height - 1).then(beyond).otherwise(nxt)
        adjacent = adjacent | ((pl.col("k") == steps.height - 1) & beyond.is_not_null())
    per = per.with_columns(
        pl.when(adjacent & (nxt > pl.col("first_ns"))).then(nxt).otherwise(pl.col("last_ns")).alias("end_ns")
    )
    host = steps.with_row_index("k").select(
        pl.col("k").cast(pl.Int64), "step", pl.col("start_ns").alias("cpu_start_ns"), (pl.col("end_ns") - pl.col("start_ns")).alias("cpu_dur_ns")
    )
    return (
        per.join(host, on="k")
        .select(
            "step",
            "device",
            pl.col("first_ns").alias("start_ns"),
            "end_ns",
            (pl.col("end_ns") - pl.col("first_ns")).alias("dur_ns"),
            "cpu_start_ns",
            "cpu_dur_ns",
            "launches",
        )
        .cast(GPU_STEP_SCHEMA)
        .sort("device", "step")
    )
