"""GPU idle gaps and what caused each one.

For each gap on a device we look at the GPU work that ended it and the host call that
launched that work (joined by CUPTI correlation id):

``dependency``  the launch call had returned before the GPU went idle: the work was queued
                but waited (another stream, an event, the copy engine) — not the host's fault.
``sync``        the host was blocked in a synchronising call (cudaStreamSynchronize,
                cudaDeviceSynchronize, a blocking memcpy — what ``.item()`` does) that returned
                as the GPU drained: the idle that follows a sync's return, until the host
                launches again, is the sync's cost (without the sync the host's work after
                it would have run while the GPU was still busy). How much of it removing
                the sync can win back is the rules' question (at most the GPU work the host
                work could have overlapped).
``launch``      a short gap (< ``LAUNCH_GAP_NS``) before a host launch: per-kernel launch and
                dispatch overhead is longer than the kernels.
``host``        a longer gap before a host launch: the host was busy elsewhere (input
                pipeline, Python, logging) while the GPU had nothing queued.
``unknown``     no launch call found for the work (host side not traced), or the idle tail
                after the last GPU work in the window.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from proflab.analysis.timeline.calls import IS_CALL, call_names
from proflab.analysis.timeline.intervals import IntervalSet
from proflab.model import Trace

__all__ = ["CAUSES", "LAUNCH_GAP_NS", "SYNC_TOLERANCE_NS", "idle_gaps", "blocking_calls", "launch_calls"]

CAUSES = ["host", "sync", "launch", "dependency", "unknown"]
LAUNCH_GAP_NS = 50_000
# A synchronising call returns shortly after the GPU drains; allow for that wake-up latency.
SYNC_TOLERANCE_NS = 5_000

_SYNC_CALL = (
    r"Synchronize|^cudaMemcpy(?:_v\d+)?$|^cudaMemcpy[23]D(?:_v\d+)?$|^cudaMemset(?:_v\d+)?$"
    r"|^cuMemcpy(?:DtoH|HtoD|DtoD)?(?:_v\d+)?$|^cuMemsetD\d+(?:_v\d+)?$"
    # HIP (ROCm traces): the blocking copies and memsets (hipMemcpyWithStream blocks too)
    r"|^hipMemcpy(?:WithStream|DtoH|HtoD|DtoD|2D|3D)?$|^hipMemset(?:D\d+|2D|3D)?$"
)

GAP_SCHEMA = {
    "device": pl.Int32,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "cause": pl.Enum(CAUSES),
    "launch_name": pl.String,
    "launch_start_ns": pl.Int64,
    "tid": pl.Int64,
    "sync_name": pl.String,
    "sync_external_id": pl.Int64,
    "step": pl.Int64,
    "correlation": pl.Int64,  # of the GPU work that ended the gap
}


def _with_step(gaps: pl.DataFrame, trace: Trace, step_table: pl.DataFrame | None) -> pl.DataFrame:
    """The step each gap starts in: per device, the step table's windows (GPU-side where
    known); without one, the host's ProfilerStep ranges."""
    if step_table is not None and step_table.height:
        win = step_table.select("device", "step", pl.col("start_ns").alias("_s"), (pl.col("start_ns") + pl.col("dur_ns")).alias("_e"))
        by = "device"
    else:
        win = trace.steps.select("step", pl.col("start_ns").alias("_s"), pl.col("end_ns").alias("_e"))
        by = None
    hit = _asof(gaps, win.sort("_s"), "_s", by, ["step", "_e"])
    return gaps.with_columns(pl.when(gaps["start_ns"] < hit["_e"]).then(hit["step"]).alias("step"))


def _asof(gaps: pl.DataFrame, right: pl.DataFrame, right_on: str, by: str | None, take: list[str]) -> pl.DataFrame:
    """``take`` from the last ``right`` row at or before each gap's start (within the same
    ``by``), in the gaps' row order. The gaps are in (device, start) order: each device's run
    is already sorted, so it is joined as it is, on its key columns only (a sort and an as-of
    join of the whole gap table each copied every column: +531 -> +375 MiB at the peak and
    0.82 -> 0.66 s for 2.2 M gaps)."""
    keys = ["start_ns", *([by] if by else [])]
    device = gaps.get_column("device").to_numpy()
    cuts = [0, *(np.flatnonzero(device[1:] != device[:-1]) + 1).tolist(), gaps.height]
    right = right.select(right_on, *([by] if by else []), *take)
    parts = [
        gaps.slice(a, b - a).select(keys)
        .join_asof(right, left_on="start_ns", right_on=right_on, by=by, strategy="backward", check_sortedness=False)
        .select(take)
        for a, b in zip(cuts[:-1], cuts[1:])
    ]  # fmt: skip
    return pl.concat(parts)


def _work_starting_at(work: pl.DataFrame, device: int, ends: np.ndarray) -> pl.Series:
    """The correlation id of the GPU work that ended each gap: the first (in the trace's start
    order) to start on the device exactly at the gap's end; null where none does. One binary
    search per gap over the device's starts (a sort and join of every GPU event took 0.5 s
    and its own copy of the table on a million-event export)."""
    on = work.filter(pl.col("device") == device)
    if on.height == 0:
        return pl.Series("correlation", [None] * ends.size, dtype=pl.Int64)
    starts = on.get_column("start_ns").to_numpy()
    if not bool((starts[1:] >= starts[:-1]).all()):  # the model keeps start order; not assumed
        on = on.sort("start_ns", maintain_order=True)
        starts = on.get_column("start_ns").to_numpy()
    i = np.searchsorted(starts, ends, side="left")
    hit = i < starts.size
    hit[hit] = starts[i[hit]] == ends[hit]
    found = on.get_column("correlation").gather(pl.Series(np.where(hit, i, 0)))
    return found.set(~pl.Series(hit), None) if not hit.all() else found


def launch_calls(trace: Trace) -> pl.DataFrame:
    """Host runtime/driver calls whose correlation id matches GPU work (they launched it)."""
    # select, then filter: only these columns are copied (the host table can be millions of
    # rows, and most runtime calls launch nothing: event records, stream queries, syncs)
    launched = trace.gpu.get_column("correlation").drop_nulls().unique()
    return (
        trace.cpu.select("cat", "correlation", "name", "start_ns", "dur_ns", "tid")
        .filter(
            pl.col("cat").is_in(["cuda_runtime", "cuda_driver"])
            & pl.col("correlation").is_not_null()
            & pl.col("correlation").is_in(launched.implode())
        )
        .select(
            "correlation",
            pl.col("name").alias("launch_name"),
            pl.col("start_ns").alias("launch_start_ns"),
            (pl.col("start_ns") + pl.col("dur_ns")).alias("launch_end_ns"),
            "tid",
        )
        .unique("correlation", keep="first")
    )


def _ended_by_next_part(gaps: pl.DataFrame, after) -> pl.DataFrame:
    """A part of a trace analysed in parts: the gap on each device that the next part's first
    work ends (``TraceMeta.next_part_work``) takes that work's launch, which this part lacks."""
    nxt = pl.DataFrame(
        [(w.device, w.start_ns, w.launch_name, w.launch_start_ns, w.launch_end_ns, w.tid) for w in after],
        schema={"device": pl.Int32, "_next_ns": pl.Int64, "_name": pl.String, "_start": pl.Int64, "_end": pl.Int64, "_tid": pl.Int64},
        orient="row",
    )
    g = gaps.join(nxt, on="device", how="left", maintain_order="left")
    ended = pl.col("correlation").is_null() & (pl.col("start_ns") < pl.col("_next_ns")) & (pl.col("end_ns") >= pl.col("_next_ns"))
    return g.with_columns(
        pl.when(ended).then(pl.col(a)).otherwise(pl.col(b)).alias(b)
        for a, b in (("_name", "launch_name"), ("_start", "launch_start_ns"), ("_end", "launch_end_ns"), ("_tid", "tid"))
    ).drop("_next_ns", "_name", "_start", "_end", "_tid")


def blocking_calls(trace: Trace) -> pl.DataFrame:
    """Host calls that block until the GPU has drained: sync APIs, blocking memcpy/memset, and
    async memcpy to or from pageable memory (staged through a driver buffer, so synchronous)."""
    pageable = (
        trace.gpu.select("kind", "src_kind", "dst_kind", "correlation")
        .filter((pl.col("kind") == "memcpy") & ((pl.col("src_kind") == "Pageable") | (pl.col("dst_kind") == "Pageable")))
        .get_column("correlation")
        .drop_nulls()
    )
    syncs = call_names(trace.cpu, _SYNC_CALL)
    # one filter over the host table (select first, so only these columns are copied), no join
    return (
        trace.cpu.select("cat", "correlation", "name", "tid", "start_ns", "dur_ns", "external_id")
        .filter(IS_CALL & (pl.col("name").is_in(syncs.implode()) | pl.col("correlation").is_in(pageable.implode())))
        .select(
            "tid",
            pl.col("name").alias("sync_name"),
            pl.col("start_ns").alias("sync_start_ns"),
            (pl.col("start_ns") + pl.col("dur_ns")).alias("sync_end_ns"),
            pl.col("external_id").alias("sync_external_id"),
        )
    )


def idle_gaps(
    trace: Trace,
    busy: dict[int, IntervalSet],
    window: tuple[int, int],
    launches: pl.DataFrame,
    step_table: pl.DataFrame | None = None,
    blocking: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Every idle gap inside the window on every active device, with its cause (see module
    doc) and the step it falls in (the step windows of ``step_table``, GPU-side where known).
    ``blocking`` is ``blocking_calls(trace)`` when the caller has it already."""
    lo, hi = window
    rows = []
    work = trace.gpu.select("device", "start_ns", "correlation")
    for device, sets in sorted(busy.items()):
        gs, ge = sets.gaps(lo, hi)
        if gs.size:
            rows.append(
                pl.DataFrame({"device": np.full(gs.size, device, dtype=np.int32), "start_ns": gs, "end_ns": ge,
                              "correlation": _work_starting_at(work, device, ge)})
            )  # fmt: skip
    del work
    if not rows:
        return pl.DataFrame(schema=GAP_SCHEMA)
    # in (device, start) order from here on, the order of the result
    gaps = pl.concat(rows).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))
    # the launch of the work that ended each gap, gathered by its row in ``launches`` (one id a
    # launch): a join of the whole gap table would copy its columns as well
    at = gaps.select("correlation").join(
        launches.select("correlation").with_row_index("_at"), on="correlation", how="left", maintain_order="left"
    )["_at"]
    gaps = gaps.with_columns(launches.drop("correlation").select(pl.all().gather(at)))
    if trace.meta.next_part_work:
        gaps = _ended_by_next_part(gaps, trace.meta.next_part_work)

    # The blocking call the launching thread was in when the GPU went idle: the latest one
    # that started before the gap (a pageable copy and the stream sync after it both block;
    # the first is the one that waited for the GPU).
    sync = (blocking if blocking is not None else blocking_calls(trace)).drop_nulls("tid").sort("sync_start_ns")
    gaps = gaps.with_columns(pl.col("tid").fill_null(-1))
    gaps = gaps.with_columns(_asof(gaps, sync, "sync_start_ns", "tid", ["sync_name", "sync_end_ns", "sync_external_id"]))
    # The sync owns the gap when it returned as the GPU drained (within the wake-up
    # tolerance of the gap's start) and the host launched again only after it returned.
    synced = (
        pl.col("sync_end_ns").is_not_null()
        & (pl.col("sync_end_ns") >= pl.col("start_ns") - SYNC_TOLERANCE_NS)
        & (pl.col("sync_end_ns") <= pl.col("launch_start_ns"))
    )
    # (each branch an Enum literal: text literals broadcast a 16-byte view per gap per branch
    # before the cast, 36 MiB each for 2.2 M gaps)
    enum = pl.Enum(CAUSES)
    cause = (
        pl.when(pl.col("launch_start_ns").is_null())
        .then(pl.lit("unknown", dtype=enum))
        .when(pl.col("launch_end_ns") <= pl.col("start_ns"))
        .then(pl.lit("dependency", dtype=enum))
        .when(synced)
        .then(pl.lit("sync", dtype=enum))
        .when(pl.col("dur_ns") < LAUNCH_GAP_NS)
        .then(pl.lit("launch", dtype=enum))
        .otherwise(pl.lit("host", dtype=enum))
    )
    gaps = gaps.with_columns(cause.alias("cause")).with_columns(
        pl.when(pl.col("cause") == "sync").then(pl.col("sync_name")).alias("sync_name"),
        pl.when(pl.col("cause") == "sync").then(pl.col("sync_external_id")).alias("sync_external_id"),
        pl.when(pl.col("tid") >= 0).then(pl.col("tid")).alias("tid"),
    )
    gaps = _with_step(gaps, trace, step_table)
    return gaps.select(list(GAP_SCHEMA)).cast(GAP_SCHEMA)
