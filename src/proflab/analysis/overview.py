"""The overview timeline of an analysed window, downsampled for a picture.

A trace of a few hundred MB holds millions of kernels; a chart a person looks at is about two
thousand pixels wide. ``overview(ctx)`` merges, per device and stream, the work of one kind
(compute, communication, memcpy, memset) whose gaps are shorter than the resolution (the window
over ``bins``) into one segment that keeps its event count, busy time and longest event's name.
The idle gaps (with their cause, from ``analysis.gaps``), the GPU-side steps and the user/NVTX
ranges come with it, each capped to the longest ``max_*`` ones: what is left out is counted,
never silently dropped. The result is plain data (times in ms from the window's start), so its
size is bounded whatever the trace's size.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from proflab.analysis.context import Context

__all__ = ["overview"]

_NAME_CHARS = 160  # longer kernel names (C++ templates) are cut for the picture; tables keep them


def overview(ctx: Context, *, bins: int = 2000, max_segments: int = 6000, max_gaps: int = 2000,
             max_ranges: int = 1500) -> dict[str, Any]:
    """Lanes and their segments over ``ctx.window``: ``segments`` (GPU work per device and
    stream), ``gaps`` (idle, by cause), ``steps`` (GPU-side) and ``ranges`` (host and GPU
    annotations); every time in ms from the window start; ``resolution_us``: the merge
    distance; ``left_out``: how many of each were not drawn (shorter than the kept ones)."""
    lo, hi = ctx.window
    wall = max(hi - lo, 1)
    res_ns = max(wall // max(bins, 1), 1)
    trace = ctx.trace
    segments, res_ns = _segments(trace.gpu, lo, hi, res_ns, max_segments)
    lanes: list[str] = []
    for s in segments:
        if s["lane"] not in lanes:
            lanes.append(s["lane"])
    left_out: dict[str, int] = {}

    gaps: list[dict[str, Any]] = []
    if trace.has_gpu and ctx.gaps.height:
        g = ctx.gaps.filter(pl.col("end_ns") > lo, pl.col("start_ns") < hi)
        kept = g.filter(pl.col("dur_ns") >= res_ns).sort("dur_ns", descending=True).head(max_gaps)
        left_out["gaps"] = g.height - kept.height
        for r in kept.sort("start_ns").iter_rows(named=True):
            gaps.append({"lane": f"GPU {r['device']} idle", "cause": str(r["cause"]),
                         "start": _ms(max(r["start_ns"], lo) - lo), "end": _ms(min(r["end_ns"], hi) - lo),
                         "dur_ms": _ms(r["dur_ns"]), "name": r.get("sync_name")})
    steps = []
    st = ctx.step_table
    if st.height:
        for r in st.sort("device", "start_ns", nulls_last=True).iter_rows(named=True):
            dev = r.get("device")
            steps.append({"lane": "steps" if dev is None else f"GPU {dev} steps", "name": f"step {r['step']}",
                          "start": _ms(r["start_ns"] - lo), "end": _ms(r["start_ns"] + r["dur_ns"] - lo),
                          "dur_ms": _ms(r["dur_ns"]), "side": str(r["side"])})
    ranges: list[dict[str, Any]] = []
    ann = trace.cpu.filter(
        pl.col("cat").is_in(["user_annotation", "gpu_user_annotation"]),
        ~pl.col("name").str.starts_with("ProfilerStep#"),
        pl.col("start_ns") < hi, (pl.col("start_ns") + pl.col("dur_ns")) > lo,
    )
    if ann.height:
        kept = ann.sort("dur_ns", descending=True).head(max_ranges)
        left_out["ranges"] = ann.height - kept.height
        for r in kept.sort("start_ns").iter_rows(named=True):
            where = "GPU" if r["cat"] == "gpu_user_annotation" else "host"
            ranges.append({"lane": f"ranges ({where} {r['tid']})", "name": _cut(r["name"]),
                           "start": _ms(max(r["start_ns"], lo) - lo), "end": _ms(min(r["start_ns"] + r["dur_ns"], hi) - lo),
                           "dur_ms": _ms(r["dur_ns"])})
    order = (sorted({s["lane"] for s in steps}) + lanes + sorted({g["lane"] for g in gaps})
             + sorted({r["lane"] for r in ranges}))
    return {
        "window_ms": _ms(wall),
        "resolution_us": round(res_ns / 1e3, 3),
        "lanes": order,
        "segments": segments,
        "gaps": gaps,
        "steps": steps,
        "ranges": ranges,
        "left_out": left_out,
    }


def _segments(gpu: pl.DataFrame, lo: int, hi: int, res_ns: int, cap: int) -> tuple[list[dict[str, Any]], int]:
    """GPU work merged per (device, stream, kind) where gaps are under ``res_ns``; the
    resolution doubles until at most ``cap`` segments remain."""
    if gpu.height == 0:
        return [], res_ns
    ev = gpu.filter(pl.col("start_ns") < hi, (pl.col("start_ns") + pl.col("dur_ns")) > lo).select(
        "device", "stream", "name", "dur_ns",
        pl.col("start_ns").clip(lo, hi).alias("s"),
        (pl.col("start_ns") + pl.col("dur_ns")).clip(lo, hi).alias("e"),
        pl.when(pl.col("is_comm")).then(pl.lit("communication"))
        .when(pl.col("kind") == "kernel").then(pl.lit("compute"))
        .otherwise(pl.col("kind").cast(pl.String)).alias("what"),
    ).sort("device", "stream", "what", "s")
    keys = ["device", "stream", "what"]
    while True:
        prev_end = pl.col("e").cum_max().shift(1).over(keys)
        seg = ev.with_columns(
            ((prev_end.is_null()) | (pl.col("s") > prev_end + res_ns)).cast(pl.Int64).cum_sum().alias("seg")
        ).group_by(*keys, "seg").agg(
            pl.col("s").min(), pl.col("e").max(), pl.len().alias("n"),
            pl.col("dur_ns").sum().alias("busy_ns"),
            pl.col("name").sort_by("dur_ns", descending=True).first().alias("top"),
        )
        if seg.height <= cap:
            break
        res_ns *= 2
    rows = []
    for r in seg.sort("device", "stream", "s").iter_rows(named=True):
        rows.append({"lane": f"GPU {r['device']} stream {r['stream']}", "kind": r["what"],
                     "start": _ms(r["s"] - lo), "end": _ms(max(r["e"], r["s"] + 1) - lo),
                     "n": r["n"], "busy_ms": _ms(r["busy_ns"]), "name": _cut(r["top"])})
    return rows, res_ns


def _ms(ns: float) -> float:
    return round(ns / 1e6, 4)


def _cut(name: str | None) -> str | None:
    if name is None or len(name) <= _NAME_CHARS:
        return name
    return name[: _NAME_CHARS - 1] + "…"
