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

from proflab.analysis.timeline.threads import ThreadClock
from proflab.model import Trace

__all__ = ["range_projection", "combined_range_tables"]

_SCHEMA = {"name": pl.String, "device": pl.Int32, "ranges": pl.UInt32, "host_ns": pl.Int64, "gpu_ns": pl.Int64, "launches": pl.UInt32}


# ranges read at a time: what the projection holds beyond the launches is one piece of the
# host table, whatever the trace's size (an Nsight Systems export of emit_nvtx ranges holds
# one range per operator: millions)
_PIECE_ROWS = 1 << 20


def range_projection(trace: Trace, launches: pl.DataFrame) -> pl.DataFrame:
    """Columns: name, device, ranges (how many of that name launched work on the device),
    host_ns (their summed duration), gpu_ns, launches; sorted by gpu_ns."""
    is_range = (
        (pl.col("cat") == "user_annotation") & ~pl.col("name").str.starts_with("ProfilerStep#") & pl.col("tid").is_not_null()
    )
    cpu = trace.cpu.select("cat", "name", "tid", "start_ns", "dur_ns")
    span = cpu.lazy().filter(is_range).select(
        pl.len().alias("n"), pl.col("start_ns").min().alias("lo"), (pl.col("start_ns") + pl.col("dur_ns")).max().alias("hi"),
        pl.col("tid").unique().implode().alias("tids"),
    ).collect()  # fmt: skip
    if span["n"][0] == 0 or not trace.has_gpu:
        return pl.DataFrame(schema=_SCHEMA)
    work = (
        trace.gpu.select("correlation", "device", "dur_ns")
        .join(launches.select("correlation", "tid", "launch_start_ns"), on="correlation", how="inner")
        .drop_nulls(["tid", "device"])
    )
    if work.height == 0:
        return pl.DataFrame(schema=_SCHEMA)
    # the clock needs only the threads and the earliest and latest times
    clock = ThreadClock([work["tid"], span["tids"].explode()], [work["launch_start_ns"], span["lo"], span["hi"]])
    key = clock.key
    wkey = key(work["tid"], work["launch_start_ns"])
    order = np.argsort(wkey, kind="stable")
    wkey = wkey[order]
    device = work["device"].to_numpy()[order]
    dur = work["dur_ns"].to_numpy()[order]
    del work, order
    running = {}  # per device: running GPU time and launch count over the sorted launches
    for d in np.unique(device):
        on = device == d
        running[int(d)] = (np.concatenate([[0], np.cumsum(np.where(on, dur, 0))]), np.concatenate([[0], np.cumsum(on)]))
    parts = []
    for first in range(0, cpu.height, _PIECE_ROWS):
        ranges = cpu.slice(first, _PIECE_ROWS).filter(is_range).drop("cat")
        if ranges.height == 0:
            continue
        rank = clock.rank(ranges["tid"])  # once for both ends
        ends = (ranges["start_ns"] + ranges["dur_ns"]).to_numpy(writable=True)
        lo = np.searchsorted(wkey, clock.key_ranked(rank, ranges["start_ns"].to_numpy(writable=True)), side="left")
        hi = np.searchsorted(wkey, clock.key_ranked(rank, ends), side="left")
        del rank, ends
        names_durs = ranges.select("name", "dur_ns")
        for d, (gpu, count) in running.items():
            n = count[hi] - count[lo]
            some = n > 0  # ranges that launched work on this device; filtered before any copy
            # summed per name right away: one small frame per device and piece
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
                .with_columns(pl.lit(d, dtype=pl.Int32).alias("device"))
            )
    return combined_range_tables(parts)


def combined_range_tables(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Range rows (per device, or of the parts of a trace analysed in parts) as one table:
    per name and device their counts and times added, most GPU time first."""
    parts = [p for p in parts if p.height]
    if not parts:
        return pl.DataFrame(schema=_SCHEMA)
    return (
        pl.concat(parts, how="vertical_relaxed")
        .group_by("name", "device")
        .agg(pl.col("ranges", "host_ns", "gpu_ns", "launches").sum())
        .select(list(_SCHEMA))
        .cast(_SCHEMA)
        .sort(["gpu_ns", "name", "device"], descending=[True, False, False])
    )
