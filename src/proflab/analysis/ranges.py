"""User ranges (NVTX, ``record_function``) projected onto the GPU work they launched.

A GPU activity belongs to every range that was open on the launching thread when its launch
call started (inclusive, as Nsight Systems projects NVTX ranges onto the GPU). Per range
name and device: how many ranges launched work there, their host time, and the GPU time of
that work — all in ns.

No range is joined to its launches one by one (nested ranges times millions of launches
would not fit in memory): launches are sorted by (thread, time) with running sums of GPU
time per device, and each range reads its total as the difference of two running sums.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from proflab.analysis.threads import ThreadClock
from proflab.model import Trace

__all__ = ["range_projection"]

_SCHEMA = {"name": pl.String, "device": pl.Int32, "ranges": pl.UInt32, "host_ns": pl.Int64, "gpu_ns": pl.Int64, "launches": pl.UInt32}


def range_projection(trace: Trace, launches: pl.DataFrame) -> pl.DataFrame:
    """Columns: name, device, ranges (how many of that name launched work on the device),
    host_ns (their summed duration), gpu_ns, launches; sorted by gpu_ns."""
    ranges = (
        trace.cpu.select("cat", "name", "tid", "start_ns", "dur_ns")
        .filter(
            (pl.col("cat") == "user_annotation") & ~pl.col("name").str.starts_with("ProfilerStep#") & pl.col("tid").is_not_null()
        )
        .drop("cat")
    )
    if ranges.height == 0 or not trace.has_gpu:
        return pl.DataFrame(schema=_SCHEMA)
    work = (
        trace.gpu.select("correlation", "device", "dur_ns")
        .join(launches.select("correlation", "tid", "launch_start_ns"), on="correlation", how="inner")
        .drop_nulls(["tid", "device"])
    )
    if work.height == 0:
        return pl.DataFrame(schema=_SCHEMA)
    ends = ranges["start_ns"] + ranges["dur_ns"]
    clock = ThreadClock([work["tid"], ranges["tid"]], [work["launch_start_ns"], ranges["start_ns"], ends])
    key = clock.key
    wkey = key(work["tid"], work["launch_start_ns"])
    order = np.argsort(wkey, kind="stable")
    wkey = wkey[order]
    device = work["device"].to_numpy()[order]
    dur = work["dur_ns"].to_numpy()[order]
    lo = np.searchsorted(wkey, key(ranges["tid"], ranges["start_ns"]), side="left")
    hi = np.searchsorted(wkey, key(ranges["tid"], ends), side="left")
    parts = []
    names_durs = ranges.select("name", "dur_ns")
    for d in np.unique(device):
        on = device == d
        gpu = np.concatenate([[0], np.cumsum(np.where(on, dur, 0))])
        count = np.concatenate([[0], np.cumsum(on)])
        n = count[hi] - count[lo]
        some = n > 0  # ranges that launched work on this device; filtered before any copy
        # summed per name right away: one small frame per device, never all ranges twice
        parts.append(
            names_durs.filter(pl.Series(some))
            .with_columns(
                pl.Series("gpu_ns", (gpu[hi] - gpu[lo])[some], dtype=pl.Int64),
                pl.Series("launches", n[some], dtype=pl.Int64),
            )
            .group_by("name")
            .agg(
                pl.len().alias("ranges"),
                pl.col("dur_ns").sum().alias("host_ns"),
                pl.col("gpu_ns").sum(),
                pl.col("launches").sum(),
            )
            .with_columns(pl.lit(int(d), dtype=pl.Int32).alias("device"))
        )
    return (
        pl.concat(parts)
        .select(list(_SCHEMA))
        .cast(_SCHEMA)
        .sort(["gpu_ns", "name", "device"], descending=[True, False, False])
    )
