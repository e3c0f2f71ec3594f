"""User ranges (NVTX, ``record_function``) projected onto the GPU work they launched.

A GPU activity belongs to every range that was open on the launching thread when its launch
call started (inclusive, as Nsight Systems projects NVTX ranges onto the GPU). Per range
name and device: how many ranges, their host time, and the GPU time of the work launched
from inside them — all in ns.
"""

from __future__ import annotations

import polars as pl

from proflab.analysis.gaps import launch_calls
from proflab.model import Trace

__all__ = ["range_projection"]


def range_projection(trace: Trace) -> pl.DataFrame:
    """Columns: name, device, ranges (how many of that name launched work on the device),
    host_ns (their summed duration), gpu_ns, launches; sorted by gpu_ns."""
    ranges = (
        trace.cpu.filter((pl.col("cat") == "user_annotation") & ~pl.col("name").str.starts_with("ProfilerStep#"))
        .select("name", pl.col("tid").alias("rtid"), pl.col("start_ns").alias("r0"), (pl.col("start_ns") + pl.col("dur_ns")).alias("r1"))
        .with_row_index("rid")
    )  # fmt: skip
    schema = {"name": pl.String, "device": pl.Int32, "ranges": pl.UInt32, "host_ns": pl.Int64, "gpu_ns": pl.Int64, "launches": pl.UInt32}
    if ranges.height == 0 or not trace.has_gpu:
        return pl.DataFrame(schema=schema)
    work = trace.gpu.select("correlation", "device", "dur_ns").join(
        launch_calls(trace).select("correlation", "tid", "launch_start_ns"), on="correlation", how="inner"
    )
    hits = ranges.join_where(
        work,
        pl.col("rtid") == pl.col("tid"),
        pl.col("launch_start_ns") >= pl.col("r0"),
        pl.col("launch_start_ns") < pl.col("r1"),
    )
    gpu = hits.group_by("name", "device").agg(pl.col("dur_ns").sum().alias("gpu_ns"), pl.len().alias("launches"))
    host = (
        ranges.join(hits.select("rid", "device").unique(), on="rid", how="inner")
        .group_by("name", "device")
        .agg(pl.len().alias("ranges"), (pl.col("r1") - pl.col("r0")).sum().alias("host_ns"))
    )
    return (
        gpu.join(host, on=["name", "device"], how="left")
        .select(list(schema))
        .cast(schema)
        .sort(["gpu_ns", "name"], descending=[True, False])
    )
