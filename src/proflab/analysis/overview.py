"""The overview timeline of an analysed window, downsampled for a picture.

A trace of a few hundred MB holds millions of kernels; a chart a person looks at is about two
thousand pixels wide. ``overview(ctx)`` merges, per device and stream, the work of one kind
(compute, communication, memcpy, memset) whose gaps are shorter than the resolution (the window
over ``bins``) into one segment that keeps its event count, busy time and longest event's name.
The idle gaps (with their cause, from ``analysis.timeline.gaps``), the GPU-side steps and the user/NVTX
ranges come with it, each capped to the longest ``max_*`` ones: what is left out is counted,
never silently dropped. The result is plain data (times in ms from the window's start), so its
size is bounded whatever the trace's size.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from proflab.analysis.context import Context

__all__ = ["overview", "part_overview", "combined_overview"]

_NAME_CHARS = 160  # longer kernel names (C++ templates) are cut for the picture; tables keep them


def overview(ctx: Context, *, bins: int = 2000, max_segments: int = 6000, max_gaps: int = 2000,
             max_ranges: int = 1500, ranges_within: tuple[int, int] | None = None, exact_busy: bool = False) -> dict[str, Any]:
    """Lanes and their segments over ``ctx.window``: ``segments`` (GPU work per device and
    stream), ``gaps`` (idle, by cause), ``steps`` (GPU-side) and ``ranges`` (host and GPU
    annotations); every time in ms from the window start; ``resolution_us``: the merge
    distance; ``left_out``: how many of each were not drawn (shorter than the kept ones).
    ``ranges_within`` (ns): the span ranges are taken from and clipped to, in place of the
    window (a part of a trace analysed in parts: its host events', which may start before
    its GPU-side window; ``combined_overview`` clips them to the whole window); ``exact_busy``:
    segments' busy time not rounded, and their longest event's duration (``top_ns``), for
    ``combined_overview``, which sums and names merged ones (rounded, a part's 1.3 us
    kernels each lost 0.04 us)."""
    lo, hi = ctx.window
    r_lo, r_hi = ranges_within or (lo, hi)
    wall = max(hi - lo, 1)
    res_ns = max(wall // max(bins, 1), 1)
    trace = ctx.trace
    segments, res_ns = _segments(trace.gpu, lo, hi, res_ns, max_segments, exact_busy)
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
        & (pl.col("start_ns") < r_hi) & ((pl.col("start_ns") + pl.col("dur_ns")) > r_lo)
    )  # fmt: skip
    kept, n = _longest(trace.cpu, ann, max_ranges, ["cat", "name", "tid", "start_ns", "dur_ns"])
    if n:
        left_out["ranges"] = n - kept.height
        for r in kept.sort("start_ns").iter_rows(named=True):
            where = "GPU" if r["cat"] == "gpu_user_annotation" else "host"
            ranges.append({"lane": f"ranges ({where} {r['tid']})", "name": _cut(r["name"]),
                           "start": _ms(max(r["start_ns"], r_lo) - lo), "end": _ms(min(r["start_ns"] + r["dur_ns"], r_hi) - lo),
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


def part_overview(ctx: Context) -> tuple[int, int, dict[str, Any] | None]:
    """A part of a trace analysed in parts: its window (ns) and its overview as
    ``combined_overview`` takes it (ranges from all its host events, busy times exact), None
    where it has neither GPU work nor steps."""
    lo, hi = ctx.window
    trace = ctx.trace
    if not (trace.has_gpu or trace.steps.height):
        return lo, hi, None
    cpu = trace.cpu
    host = cpu.select(pl.col("start_ns").min(), (pl.col("start_ns") + pl.col("dur_ns")).max().alias("end_ns")).row(0) if cpu.height else None
    return lo, hi, overview(ctx, ranges_within=host, exact_busy=True)


def combined_overview(views: list[tuple[int, dict[str, Any] | None]], lo: int, hi: int, *, bins: int = 2000,
                      max_segments: int = 6000, max_gaps: int = 2000, max_ranges: int = 1500) -> dict[str, Any]:
    """The overview of a trace analysed in consecutive parts (``report.combine``) from each
    part's (``views``: the part's window start in ns and its overview) over the combined
    window ``[lo, hi)``: every item moved to the combined window's clock; segments of a lane
    and kind merged again where their gaps are under the combined resolution (which doubles
    until at most ``max_segments`` remain), each named after its longest event; the longest
    gaps and ranges kept to their caps, what is left out counted with the parts' own."""
    wall = max(hi - lo, 1)
    res_ns = max(wall // max(bins, 1), 1, *(int(v["resolution_us"] * 1e3) for _, v in views if v))
    segments, gaps, steps, ranges, left_out, lanes = [], [], [], [], {}, []

    def moved(items: list[dict[str, Any]], shift: float) -> list[dict[str, Any]]:
        return [{**x, "start": round(x["start"] + shift, 4), "end": round(x["end"] + shift, 4)} for x in items]

    for start, v in views:
        if not v:
            continue
        shift = (start - lo) / 1e6
        segments += moved(v["segments"], shift)
        gaps += moved(v["gaps"], shift)
        steps += moved(v["steps"], shift)
        ranges += moved(v["ranges"], shift)
        for k, n in v["left_out"].items():
            left_out[k] = left_out.get(k, 0) + n
        lanes += [x for x in v["lanes"] if x not in lanes]
    while True:
        merged = _merged_segments(segments, res_ns / 1e6)
        if len(merged) <= max_segments:
            break
        res_ns *= 2
    # gaps as a whole window's overview draws them: none under the resolution
    drawn = [g for g in gaps if g["dur_ms"] * 1e6 >= res_ns]
    if len(drawn) < len(gaps):
        left_out["gaps"] = left_out.get("gaps", 0) + len(gaps) - len(drawn)
    gaps = drawn
    # ranges clipped to the whole window (a part's reach past its own); one across a cut, whole
    # in both parts, drawn once
    end_ms = _ms(wall)
    clipped = {}
    for r in ranges:
        if r["end"] > 0 and r["start"] < end_ms:
            r = {**r, "start": max(r["start"], 0.0), "end": min(r["end"], end_ms)}
            clipped.setdefault((r["lane"], r["name"], r["start"], r["end"], r["dur_ms"]), r)
    ranges = list(clipped.values())
    for name, items, cap in (("gaps", gaps, max_gaps), ("ranges", ranges, max_ranges)):
        if len(items) > cap:
            left_out[name] = left_out.get(name, 0) + len(items) - cap
            keep = sorted(items, key=lambda x: (-x["dur_ms"], x["start"]))[:cap]
            items[:] = sorted(keep, key=lambda x: x["start"])
    seen = {x["lane"] for x in (*merged, *gaps, *steps, *ranges)}
    return {
        "window_ms": _ms(wall),
        "resolution_us": round(res_ns / 1e3, 3),
        "lanes": [x for x in lanes if x in seen],
        "segments": merged,
        "gaps": gaps,
        "steps": steps,
        "ranges": ranges,
        "left_out": left_out,
    }


def _merged_segments(segments: list[dict[str, Any]], res_ms: float) -> list[dict[str, Any]]:
    """Segments of one lane and kind merged where the gap between them is at most ``res_ms``
    (as ``_segments`` merges events), each named after its longest event and its busy time
    rounded once summed (the parts' are given unrounded, with their longest event's duration:
    ``overview``'s ``exact_busy``)."""
    out: list[dict[str, Any]] = []
    for x in sorted(segments, key=lambda x: (x["lane"], x["kind"], x["start"])):
        last = out[-1] if out else None
        if last is not None and last["lane"] == x["lane"] and last["kind"] == x["kind"] and x["start"] <= last["end"] + res_ms:
            if x.get("top_ns", 0) > last.get("top_ns", 0):  # named after its longest event
                last["name"], last["top_ns"] = x["name"], x["top_ns"]
            last.update(end=max(last["end"], x["end"]), n=last["n"] + x["n"], busy_ms=last["busy_ms"] + x["busy_ms"])
        else:
            out.append(dict(x))
    for x in out:
        x["busy_ms"] = round(x["busy_ms"], 4)
        x.pop("top_ns", None)
    return sorted(out, key=lambda x: (x["lane"], x["start"]))


def _segments(gpu: pl.DataFrame, lo: int, hi: int, res_ns: int, cap: int, exact_busy: bool = False) -> tuple[list[dict[str, Any]], int]:
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
            pl.col("dur_ns").max().alias("top_ns"),
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
                     "n": r["n"], "busy_ms": r["busy_ns"] / 1e6 if exact_busy else _ms(r["busy_ns"]), "name": _cut(r["top"]),
                     **({"top_ns": r["top_ns"]} if exact_busy else {})})
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
