"""FLOPs of a trace's matrix multiplies, from the shapes torch.profiler recorded.

Counted (``record_shapes=True`` puts each operator's ``Input Dims`` in the trace):

- ``aten::mm``, ``aten::_scaled_mm`` ``[m,k] @ [k,n]``: 2·m·k·n
- ``aten::addmm``, ``aten::_addmm_activation`` (bias, ``[m,k]``, ``[k,n]``): 2·m·k·n
- ``aten::bmm`` ``[b,m,k] @ [b,k,n]``; ``aten::baddbmm``, ``aten::addbmm`` (bias first): 2·b·m·k·n

These are the leaves the composite operators (``aten::linear``, ``aten::matmul``,
``aten::einsum``) dispatch to, in the forward and the backward pass alike, so the composites
are not counted (they would count their leaves twice). Bias additions and element-wise work
are not FLOPs here: the count is of matrix-multiply FLOPs (multiply + add = 2).

Convolutions are not counted: ``Input Dims`` lack stride, padding and dilation, so the output
size is unknown. A trace with convolutions gets no FLOP count at all (a count without them
would understate the work), and says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import polars as pl

from proflab.model import Trace

__all__ = ["FlopCount", "gemm_flops", "ncu_flops", "op_flops"]

_MM = ("aten::mm", "aten::_scaled_mm")
_ADDMM = ("aten::addmm", "aten::_addmm_activation")
_BMM = ("aten::bmm",)
_BADDBMM = ("aten::baddbmm", "aten::addbmm")
_COUNTED = _MM + _ADDMM + _BMM + _BADDBMM
_CONV = r"^aten::(?:_?conv|cudnn_conv|miopen_conv)"


def op_flops(name: str, dims: list) -> int | None:
    """Matrix-multiply FLOPs of one operator call from its input shapes; None when the shapes
    are not those of the operator."""
    try:
        if name in _MM:
            (m, k), (k2, n) = dims[0], dims[1]
            return 2 * m * k * n if k == k2 else None
        if name in _ADDMM:
            (m, k), (k2, n) = dims[1], dims[2]
            return 2 * m * k * n if k == k2 else None
        if name in _BMM:
            (b, m, k), (b2, k2, n) = dims[0], dims[1]
        elif name in _BADDBMM:
            (b, m, k), (b2, k2, n) = dims[1], dims[2]
        else:
            return None
        return 2 * b * m * k * n if k == k2 and b == b2 else None
    except (TypeError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class FlopCount:
    """``flop``: matrix-multiply FLOPs in the trace (None when not countable, ``missing`` says
    why); ``per_step``: columns step, flop (the operators launched inside each host step);
    ``ops``: operators counted; ``source``: how they were counted."""

    flop: int | None
    per_step: pl.DataFrame
    ops: int
    source: str
    missing: str = ""


_PER_STEP = {"step": pl.Int64, "flop": pl.Int64}


def _none(why: str) -> FlopCount:
    return FlopCount(None, pl.DataFrame(schema=_PER_STEP), 0, "", why)


def gemm_flops(trace: Trace) -> FlopCount:
    """Matrix-multiply FLOPs of ``trace`` from its recorded input shapes (see the module)."""
    cpu = trace.cpu.filter(pl.col("cat") == "cpu_op")
    if trace.meta.record_shapes is False:
        return _none("the trace was recorded without record_shapes: no input shapes to count GEMM FLOPs from")
    if cpu.filter(pl.col("name").str.contains(_CONV)).height:
        return _none("the trace has convolutions, whose FLOPs the recorded shapes cannot give (no stride or padding)")
    ops = cpu.filter(pl.col("name").is_in(_COUNTED)).select("name", "start_ns", "input_dims")
    if ops.height == 0:
        return _none("no matrix-multiply operator (aten::mm/addmm/bmm/baddbmm) in the trace")
    if ops["input_dims"].null_count() == ops.height:
        return _none("the matrix-multiply operators carry no input shapes (record_shapes off)")
    flops = []
    for name, dims in zip(ops["name"], ops["input_dims"]):
        f = None if dims is None else op_flops(name, json.loads(dims))
        if f is None:
            return _none(f"{name} with shapes {dims}: not a matrix multiply the shapes describe; no FLOP count")
        flops.append(f)
    fl = np.array(flops, dtype=np.int64)
    steps = trace.steps.sort("start_ns")
    per_step = pl.DataFrame(schema=_PER_STEP)
    if steps.height:
        t = ops["start_ns"].to_numpy()
        s0, s1 = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
        k = np.searchsorted(s0, t, side="right") - 1
        inside = (k >= 0) & (t < s1[np.maximum(k, 0)])
        sums = np.bincount(k[inside], weights=fl[inside].astype(np.float64), minlength=steps.height)
        per_step = pl.DataFrame({"step": steps["step"], "flop": sums.round().astype(np.int64)}, schema=_PER_STEP)
    return FlopCount(int(fl.sum()), per_step, int(ops.height),
                     "shapes: aten::mm/addmm/bmm/baddbmm input dims (record_shapes), 2·m·k·n per multiply")


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
