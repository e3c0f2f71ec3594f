"""The overview timeline (``analysis.overview``): bounded plain data, built without copying every
event's columns; checked against the whole tables on a real trace."""

from __future__ import annotations

from pathlib import Path

import polars as pl

import proflab
from proflab.analysis.context import Context
from proflab.analysis.overview import _longest, overview

REAL = Path(__file__).parent / "data" / "realistic" / "lm_bf16.heavy.pt.trace.json.xz"


def test_longest_keeps_the_longest_rows_ties_to_the_earliest():
    frame = pl.DataFrame({"start_ns": [10, 20, 5, 1, 2, 7], "dur_ns": [5, 3, 5, 1, 3, 3], "x": list("abcdef")})
    kept, n = _longest(frame, pl.col("dur_ns") > 1, 3, ["start_ns", "dur_ns", "x"])
    assert n == 5
    assert kept.rows() == [(5, 5, "c"), (10, 5, "a"), (2, 3, "e")]
    kept, n = _longest(frame, pl.col("dur_ns") > 100, 3, ["x"] + ["start_ns", "dur_ns"])
    assert n == 0 and kept.height == 0 and kept.columns == ["x", "start_ns", "dur_ns"]


def test_overview_of_a_real_trace_matches_its_tables():
    trace = proflab.load(REAL, cache=False)
    ctx = Context(trace)
    ov = overview(ctx, max_segments=400, max_ranges=5, max_gaps=40)
    lo, hi = ctx.window
    # every GPU event inside the window is in exactly one segment, and their time adds up
    gpu = trace.gpu.filter(pl.col("start_ns") < hi, (pl.col("start_ns") + pl.col("dur_ns")) > lo)
    assert sum(s["n"] for s in ov["segments"]) == gpu.height
    assert abs(sum(s["busy_ms"] for s in ov["segments"]) - gpu["dur_ns"].sum() / 1e6) < 1e-3 * len(ov["segments"])
    assert len(ov["segments"]) <= 400
    kinds = {s["kind"] for s in ov["segments"]}
    assert kinds <= {"communication", "compute", "memcpy", "memset"} and "compute" in kinds
    # the ranges drawn are the 5 longest annotations (ties to the earliest), the rest counted
    ann = trace.cpu.filter(
        pl.col("cat").is_in(["user_annotation", "gpu_user_annotation"]), ~pl.col("name").str.starts_with("ProfilerStep#"),
        pl.col("start_ns") < hi, (pl.col("start_ns") + pl.col("dur_ns")) > lo,
    )  # fmt: skip
    assert ann.height > 5
    want = ann.sort(["dur_ns", "start_ns"], descending=[True, False], maintain_order=True).head(5).sort("start_ns")
    assert [r["name"] for r in ov["ranges"]] == want["name"].to_list()
    assert ov["left_out"]["ranges"] == ann.height - 5
    # the gaps drawn: the 40 longest at or above the resolution; the others inside the window counted
    res_ns = ov["resolution_us"] * 1e3
    g = ctx.gaps.filter(pl.col("end_ns") > lo, pl.col("start_ns") < hi)
    drawn = g.filter(pl.col("dur_ns") >= res_ns).height
    assert len(ov["gaps"]) == min(40, drawn) and ov["left_out"]["gaps"] == g.height - len(ov["gaps"])
