"""FLOPs of a trace's kernels from an Nsight Compute profile of the same program (``ncu_flops``):
what the hardware executed, per launch, where the trace's operators carry no shapes.

The FLOPs of the operators themselves, from their recorded shapes or from the step
``proflab run`` counts, are ``analysis.perf``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from proflab.model import Trace

__all__ = ["FlopCount", "ncu_flops"]


@dataclass(frozen=True)
class FlopCount:
    """``flop``: FLOPs of the trace's kernels (None when not countable, ``missing`` says why);
    ``per_step``: columns step, flop (the kernels launched inside each host step); ``ops``:
    kernel launches counted; ``source``: how they were counted."""

    flop: int | None
    per_step: pl.DataFrame
    ops: int
    source: str
    missing: str = ""


_PER_STEP = {"step": pl.Int64, "flop": pl.Int64}


def _none(why: str) -> FlopCount:
    return FlopCount(None, pl.DataFrame(schema=_PER_STEP), 0, "", why)


def ncu_flops(profile, trace: Trace) -> FlopCount:
    """FLOPs of ``trace``'s kernels from an Nsight Compute profile of the same program: each
    timeline kernel gets the FLOPs ncu counted for the kernel it matches (``deepdive.
    match_kernels``: the same name, else the same function) with the same grid and block,
    per launch: a kernel of that name and launch shape is taken to do the same work.
    Every kernel launched inside the host steps must have its ncu count; otherwise none is
    given (a partial count would understate the work), and ``missing`` says how much was
    measured."""
    from proflab.analysis.deepdive.join import _grid, match_kernels
    from proflab.analysis.timeline.gaps import launch_calls
    from proflab.analysis.deepdive.verdicts import verdicts

    dev = trace.devices["name"][0] if trace.devices.height else None
    vs = [v for v in verdicts(profile, dev) if v.roofline is not None and v.roofline.flop]
    if not vs:
        return _none("the ncu profile has no FLOP counts (no instruction or tensor-op counters)")
    shape = lambda p: pl.concat_str([pl.col(f"{p}_x"), pl.col(f"{p}_y"), pl.col(f"{p}_z")], separator="x")  # noqa: E731
    kern = trace.kernels.with_columns(shape("grid").alias("grid"), shape("block").alias("block"))
    launches = launch_calls(trace)
    steps = trace.steps.sort("start_ns")
    if steps.height == 0 or launches.height == 0:
        return _none("no host steps (or no launch calls) to place the kernels ncu counted")
    work = kern.join(launches.select("correlation", "launch_start_ns"), on="correlation", how="inner")
    t = work["launch_start_ns"].to_numpy()
    s0, s1 = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    k = np.searchsorted(s0, t, side="right") - 1
    inside = (k >= 0) & (t < s1[np.maximum(k, 0)])
    work = work.with_columns(pl.Series("k", np.where(inside, k, -1))).filter(pl.col("k") >= 0)
    if work.height == 0:
        return _none("no kernel launched inside the host steps")
    rows = (work.group_by("name", "grid", "block").agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("total_ns"))
            .to_dicts())
    per_launch: dict[tuple, float] = {}
    for v in vs:
        # a kernel's work depends on its problem size, which its name does not carry: a
        # timeline launch takes ncu's count only with the same grid and block too
        shape = (_grid(v.grid), _grid(v.block))
        if None in shape:
            continue
        for r in match_kernels(v, rows):
            if (r["grid"], r["block"]) == shape:
                per_launch.setdefault((r["name"], r["grid"], r["block"]), v.roofline.total_flop)
    got = [r for r in rows if (r["name"], r["grid"], r["block"]) in per_launch]
    if len(got) < len(rows):
        share = 100 * sum(r["total_ns"] for r in got) / max(1, sum(r["total_ns"] for r in rows))
        return _none(f"ncu counted FLOPs for {len(got)} of the {len(rows)} kernels launched in the steps "
                     f"({share:.0f}% of their GPU time): no FLOP count from ncu")
    fl = np.array([per_launch[(n, g, b)] for n, g, b in work.select("name", "grid", "block").iter_rows()])
    sums = np.bincount(work["k"].to_numpy(), weights=fl, minlength=steps.height)
    per_step = pl.DataFrame({"step": steps["step"], "flop": sums.round().astype(np.int64)}, schema=_PER_STEP)
    return FlopCount(int(round(fl.sum())), per_step, int(work.height),
                     "ncu: FLOPs counted per kernel (SASS instructions and tensor ops), per launch in the steps")
