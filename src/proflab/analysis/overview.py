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
        inside = (pl.col("end_ns") > lo) & (pl.col("start_ns") < hi)
        kept, n = _longest(ctx.gaps, inside & (pl.col("dur_ns") >= res_ns), max_gaps,
                           ["device", "cause", "start_ns", "end_ns", "dur_ns", "sync_name"])
        left_out["gaps"] = ctx.gaps.select(inside.sum()).item() - kept.height
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
    ann = (
        pl.col("cat").is_in(["user_annotation", "gpu_user_annotation"])
        & ~pl.col("name").str.starts_with("ProfilerStep#")
        & (pl.col("start_ns") < hi) & ((pl.col("start_ns") + pl.col("dur_ns")) > lo)
    )  # fmt: skip
    kept, n = _longest(trace.cpu, ann, max_ranges, ["cat", "name", "tid", "start_ns", "dur_ns"])
    if n:
        left_out["ranges"] = n - kept.height
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
    resolution doubles until at most ``cap`` segments remain. The work's kind travels as a
    code and its name as its row (each segment's longest is named at the end): 2.2 M events
    of the 1 GB export held a 16-byte view of both per event."""
    if gpu.height == 0:
        return [], res_ns
    what = (
        pl.when(pl.col("is_comm")).then(0)
        .when(pl.col("kind") == "kernel").then(1)
        .when(pl.col("kind") == "memcpy").then(2)
        .otherwise(3)
        .cast(pl.UInt8)
    )  # fmt: skip
    ev = (
        gpu.lazy()
        .with_row_index("row")
        .filter(pl.col("start_ns") < hi, (pl.col("start_ns") + pl.col("dur_ns")) > lo)
        .select(
            "row", "device", "stream", "dur_ns",
            pl.col("start_ns").clip(lo, hi).alias("s"),
            (pl.col("start_ns") + pl.col("dur_ns")).clip(lo, hi).alias("e"),
            what.alias("what"),
        )
        .sort("device", "stream", "what", "s")
        .collect()
    )  # fmt: skip
    # each (device, stream, kind) lane's rows are contiguous: numbered, the end before each event
    # in its lane comes from one integer key, and only the lanes' first rows keep the three keys
    keys = ["device", "stream", "what"]
    ev = ev.with_columns(
        pl.any_horizontal(pl.col(k).ne_missing(pl.col(k).shift(1)) for k in keys).cum_sum().cast(pl.UInt32).alias("lane")
    )
    lanes = ev.filter(pl.col("lane").ne_missing(pl.col("lane").shift(1))).select("lane", *keys)
    ev = ev.select("lane", "row", "dur_ns", "s", "e", pl.col("e").cum_max().shift(1).over("lane").alias("prev_end"))
    while True:
        seg = ev.select(
            (pl.col("prev_end").is_null() | (pl.col("s") > pl.col("prev_end") + res_ns)).cast(pl.Int64).cum_sum().alias("seg"),
            "lane", "row", "dur_ns", "s", "e",
        ).group_by("seg").agg(
            pl.col("lane").first(),  # (a segment never spans two lanes: each lane's first event opens one)
            pl.col("s").min(), pl.col("e").max(), pl.len().alias("n"),
            pl.col("dur_ns").sum().alias("busy_ns"),
            pl.col("row").sort_by("dur_ns", descending=True).first().alias("top"),
        )
        if seg.height <= cap:
            break
        res_ns *= 2
    seg = seg.join(lanes, on="lane", how="left").sort("device", "stream", "s")
    seg = seg.with_columns(gpu.get_column("name").gather(seg.get_column("top")).alias("top"))
    rows = []
    for r in seg.iter_rows(named=True):
        rows.append({"lane": f"GPU {r['device']} stream {r['stream']}", "kind": _WHAT[r["what"]],
                     "start": _ms(r["s"] - lo), "end": _ms(max(r["e"], r["s"] + 1) - lo),
                     "n": r["n"], "busy_ms": _ms(r["busy_ns"]), "name": _cut(r["top"])})
    return rows, res_ns


# the kinds of GPU work a segment holds, by code (in the order their names sort)
_WHAT = ("communication", "compute", "memcpy", "memset")


def _longest(frame: pl.DataFrame, where: pl.Expr, cap: int, columns: list[str]) -> tuple[pl.DataFrame, int]:
    """The ``cap`` longest rows (``dur_ns``) that meet ``where``, with only ``columns``, and
    how many meet it. From a mask and the durations of the rows it selects, only the rows as
    long as the cap's shortest are taken (ties at the cut go to the earliest): an emit_nvtx
    export holds a range per operator, and every one of its 8.6 M ranges' columns, sorted,
    raised the report's peak from 1.4 to 2.2 GiB."""
    mask = frame.select(where.fill_null(False).alias("m")).to_series()
    n = int(mask.sum())
    if n > cap:
        floor = frame.get_column("dur_ns").filter(mask).top_k(cap).min()
        mask &= frame.get_column("dur_ns") >= floor
    rows = frame.lazy().select(columns).filter(mask).collect()
    return rows.sort(["dur_ns", "start_ns"], descending=[True, False], maintain_order=True).head(cap), n


def _ms(ns: float) -> float:
    return round(ns / 1e6, 4)


def _cut(name: str | None) -> str | None:
    if name is None or len(name) <= _NAME_CHARS:
        return name
    return name[: _NAME_CHARS - 1] + "…"
