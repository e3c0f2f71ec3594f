"""Operators as the performance model sees them: each kernel's GPU time given to the host
operator it belongs to, and that operator's FLOPs and bytes (``_formulas``).

An operator the model knows (``op_class``) is *modelled* where its formula takes its
recorded inputs, or where the trace recorded no shapes at all (its time then still goes to
its class, its FLOPs unknown). A kernel belongs to the outermost modelled operator around
its launch on the launching thread: ``aten::convolution`` holds its cuDNN kernels and its
bias addition, an attention its whole kernel sequence, ``Optimizer.step#AdamW.step`` (the
range torch.optim opens around every step) all the optimizer's kernels, so nothing is
counted twice. A kernel under no modelled operator is *unmodelled*: listed under the
outermost known operator whose inputs the formula could not take (with why), else under the
operator that launched it, with its time, never counted as zero FLOPs in silence.

Only kernels launched inside the profiler steps count, where the trace has steps (a kernel
whose launch was not recorded, queued before the window opened, belongs to no operator and
is only counted aside); communication kernels have their own analysis and are left out.

An optimizer's tensor lists carry no shapes: its bytes are the parameters' (the gradients
``AccumulateGrad`` received in the step, their numel and dtype) times the tensors its
update reads and writes per parameter (``_OPTIMIZER_PASSES``: AdamW reads the parameter,
its gradient and two moments, and writes the parameter and the moments back: 7).
"""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl

from proflab.analysis.perf._formulas import DTYPES, Cost, cost, op_class
from proflab.analysis.timeline.kernels import TENSOR_CORE_PATTERN
from proflab.model import Trace

__all__ = ["OP_SCHEMA", "UNMODELLED_SCHEMA", "OperatorTable", "operator_table"]

OP_SCHEMA = {
    "op": pl.String,
    "cls": pl.String,
    "signature": pl.String,  # the operator, its input shapes and compute dtype: one row of "top operators"
    "dtype": pl.String,
    "tid": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "step": pl.Int64,  # the host step it started in (null: outside the steps)
    "flops": pl.Int64,  # model FLOPs (null: not known)
    "exec_flops": pl.Int64,  # executed FLOPs
    "bytes": pl.Int64,  # compulsory traffic (null: not known)
    "recompute": pl.Boolean,  # a forward operator run again in the backward pass (activation checkpointing)
    "gpu_ns": pl.Int64,  # its kernels' summed duration
    "kernels": pl.Int64,
    "tensor_cores": pl.Boolean,  # a kernel of it is a tensor-core one (by name)
}
UNMODELLED_SCHEMA = {"op": pl.String, "reason": pl.String, "kernels": pl.Int64, "gpu_ns": pl.Int64}

OPTIMIZER_RANGE = r"^Optimizer\.step#(.+)\.step$"
_EVALUATE = "autograd::engine::evaluate_function:"
_ACCUMULATE = "torch::autograd::AccumulateGrad"
# Per parameter element: how many tensors of the parameter's size the update reads and writes
# (the parameter, its gradient, the state it keeps). An optimizer not listed gets the least
# any update moves (read parameter and gradient, write the parameter), and says so.
_OPTIMIZER_PASSES = {
    "Adam": 7, "AdamW": 7, "NAdam": 7, "RAdam": 7, "Adamax": 7, "Lion": 5, "Adagrad": 5, "RMSprop": 5,
    "Adadelta": 7, "SGD": 3, "ASGD": 5, "Rprop": 7,
}  # fmt: skip
MIN_OPTIMIZER_PASSES = 3


class OperatorTable:
    """``ops``: one row per modelled operator call (``OP_SCHEMA``); ``unmodelled``: the GPU time
    no modelled operator holds, by operator (``UNMODELLED_SCHEMA``); ``kernel_ns``: all counted
    kernels' time (the shares' denominator); ``outside_ns``: kernels left out (their launch
    not recorded, or outside the steps); ``notes``: what the model assumed."""

    def __init__(self, ops: pl.DataFrame, unmodelled: pl.DataFrame, kernel_ns: int, outside_ns: int, shapes: bool,
                 notes: tuple[str, ...]) -> None:
        self.ops, self.unmodelled, self.kernel_ns, self.outside_ns = ops, unmodelled, kernel_ns, outside_ns
        self.shapes, self.notes = shapes, notes


def _outermost(t: pl.DataFrame, where: pl.Expr | None = None) -> pl.DataFrame:
    """The rows of ``t`` (ranges on threads; those ``where`` holds, if given) that no earlier
    such row on the same thread encloses, in thread, start and longest-first order. Only the
    three columns are filtered and sorted, and the rows kept are gathered whole: the
    operators filtered and sorted with all their texts held 140 MiB more at the 1 GB
    realistic trace's peak."""
    keys = t.select("tid", "start_ns", "end_ns").with_row_index("_row")
    if where is not None:
        keys = keys.filter(t.select(where).to_series())
    if keys.height == 0:
        return t.clear()
    keys = keys.sort(["tid", "start_ns", "end_ns"], descending=[False, False, True])
    reach = pl.col("end_ns").cum_max().shift(1).over("tid")
    return t[keys.filter(reach.is_null() | (pl.col("start_ns") >= reach)).get_column("_row")]


def _place(points: pl.DataFrame, ranges: pl.DataFrame, at: str, id_col: str) -> pl.DataFrame:
    """``points`` (``tid``, ``at``) with ``id_col`` of the range of ``ranges`` (non-overlapping
    per thread: ``tid``, ``start_ns``, ``end_ns``, ``id_col``) that holds each, null where none."""
    r = ranges.select("tid", pl.col("start_ns").alias("_r0"), pl.col("end_ns").alias("_r1"), id_col).sort("_r0")
    # (the points' thread and time only are sorted and joined, twice; then the column is
    # added: sorting every column of the operators cost the 1 GB realistic trace 67 MiB more)
    out = (points.select("tid", at).with_row_index("_i").sort(at)
           .join_asof(r, left_on=at, right_on="_r0", by="tid", strategy="backward", check_sortedness=False)
           .sort("_i"))  # fmt: skip
    inside = pl.col("_r1").is_not_null() & (pl.col(at) < pl.col("_r1"))
    return points.with_columns(out.select(pl.when(inside).then(pl.col(id_col)).alias(id_col)).to_series())


def _step_of(t: np.ndarray, steps: pl.DataFrame) -> np.ndarray:
    """The host step (its number) each time in ``t`` falls in; -1 outside them."""
    s = steps.sort("start_ns")
    s0, s1, num = s["start_ns"].to_numpy(), s["end_ns"].to_numpy(), s["step"].to_numpy()
    k = np.searchsorted(s0, t, side="right") - 1
    inside = (k >= 0) & (t < s1[np.maximum(k, 0)])
    return np.where(inside, num[np.maximum(k, 0)], -1)


def _signature(name: str, types: str | None, dims: str | None, dtype: str | None) -> str:
    """``aten::mm [16384,384]x[384,1152] bf16``: the name and the shapes of its tensor inputs."""
    if dims is None or types is None:
        return name
    try:
        shapes = [d for t, d in zip(types.split(","), json.loads(dims)) if t in DTYPES and isinstance(d, list)]
    except ValueError:
        return name
    text = "x".join("[" + ",".join(map(str, d)) + "]" for d in shapes)
    return " ".join(x for x in (name, text, dtype) if x)


def operator_table(trace: Trace, launches: pl.DataFrame) -> OperatorTable:
    """The model's view of ``trace`` (see the module); ``launches`` is ``gaps.launch_calls``."""
    notes: list[str] = []
    host = trace.cpu.select("cat", "name", "tid", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
                            "external_id", "sequence", "input_types", "input_dims", "input_concrete")
    # The operators are most of the host's events: filtered whole, each filter copied their
    # input texts (the shapes' JSON), 190 MiB at the 514 MB trace's peak. Lazily, only the
    # columns each result needs are copied, and only the modelled operators' rows whole.
    is_op = pl.col("cat") == "cpu_op"
    shapes, names = host.lazy().filter(is_op).select(
        pl.col("input_dims").is_not_null().any().alias("shapes"), pl.col("name").drop_nulls().unique().implode().alias("names")
    ).collect().row(0)  # fmt: skip
    shapes = bool(shapes)
    classes = {n: c for n in names if (c := op_class(n)) is not None}
    cand = host.filter(is_op & pl.col("name").is_in(list(classes))).drop("cat")
    keys = ["name", "input_types", "input_dims", "input_concrete"]
    sig = cand.select(keys).unique()
    got = [cost(*row) for row in sig.iter_rows()]  # once per distinct call, never per event
    sig = sig.with_columns(
        pl.col("name").replace_strict(classes, default=None, return_dtype=pl.String).alias("cls"),
        pl.Series("flops", [g.flops if isinstance(g, Cost) else None for g in got], dtype=pl.Int64),
        pl.Series("exec_flops", [g.exec_flops if isinstance(g, Cost) else None for g in got], dtype=pl.Int64),
        pl.Series("bytes", [g.bytes if isinstance(g, Cost) else None for g in got], dtype=pl.Int64),
        pl.Series("dtype", [g.dtype if isinstance(g, Cost) else None for g in got], dtype=pl.String),
        pl.Series("why", [None if isinstance(g, Cost) else g for g in got], dtype=pl.String),
        pl.Series("signature", [_signature(r[0], r[1], r[2], g.dtype if isinstance(g, Cost) else None)
                                for r, g in zip(sig.iter_rows(), got)], dtype=pl.String),
    ).with_row_index("sid")
    # Each call carries its distinct call's row (``sid``) and whether the formula took it; what
    # that row says (class, FLOPs, bytes, dtype, why, signature) is joined onto the few calls
    # read on (the outermost), not onto every call: on every call those texts and counts held
    # 111 MiB above what the table starts from at the 1 GB realistic trace
    cols = ["name", "tid", "start_ns", "end_ns", "external_id", "sequence", "input_dims", "sid", "known"]
    cand = cand.lazy().join(sig.lazy().select(*keys, "sid", pl.col("why").is_null().alias("known")), on=keys, how="left",
                            nulls_equal=True).select(cols).collect()  # fmt: skip
    # the optimizer's step: the range torch.optim opens, its bytes from the parameters (below)
    # (the pattern on the few annotations only: on every host event it cost the 514 MB trace 10 ms)
    opt = host.filter(pl.col("cat") == "user_annotation").filter(pl.col("name").str.contains(OPTIMIZER_RANGE)).drop("cat")
    opt = opt.with_columns(pl.lit(None, dtype=pl.UInt32).alias("sid"), pl.lit(True).alias("known"))
    cand = pl.concat([cand, opt.select(cols)]).drop_nulls(["tid", "start_ns"]).with_row_index("cid")
    cand = cand.with_columns(pl.col("cid").cast(pl.Int64))
    roots = _outermost(cand, pl.col("known") | pl.col("input_dims").is_null()).drop("known")
    # (what is read of the outermost known operators: sorted with every column they were
    # 96 MiB more at the 1 GB trace's peak)
    outer = _outermost(cand.select("tid", "start_ns", "end_ns", "cid", "name", "sid"))
    del cand
    # what each distinct call says, on the calls read on; an optimizer step is its range: its
    # class "optimizer", its name its signature, its FLOPs (a few per parameter) not modelled
    # (null, not zero), its bytes from the parameters (``_optimizer_bytes``)
    said = sig.select("sid", "cls", "flops", "exec_flops", "bytes", "dtype", "why", "signature")
    roots = roots.join(said, on="sid", how="left", maintain_order="left").with_columns(
        pl.col("cls").fill_null(pl.when(pl.col("sid").is_null()).then(pl.lit("optimizer"))),
        pl.col("signature").fill_null(pl.col("name")))
    outer = outer.join(said.select("sid", "why"), on="sid", how="left", maintain_order="left")

    # the kernels, each with the launch that made it
    k = trace.gpu.filter((pl.col("kind") == "kernel") & ~pl.col("is_comm").fill_null(False)).select(
        "correlation", "name", "dur_ns", "external_id")
    k = k.join(launches.select("correlation", "tid", "launch_start_ns"), on="correlation", how="left")
    tied = pl.col("launch_start_ns").is_not_null()
    if trace.steps.height:
        k = k.with_columns(pl.Series("step", _step_of(k["launch_start_ns"].fill_null(-(2**62)).to_numpy(), trace.steps)))
        tied = tied & (pl.col("step") >= 0)
    outside_ns = int(k.filter(~tied).get_column("dur_ns").sum())
    k = k.filter(tied)
    kernel_ns = int(k.get_column("dur_ns").sum())
    k = _place(k, roots.select("tid", "start_ns", "end_ns", pl.col("cid").alias("rid")), "launch_start_ns", "rid")
    k = _place(k, outer.select("tid", "start_ns", "end_ns", pl.col("cid").alias("oid")), "launch_start_ns", "oid")
    k = k.with_columns(pl.col("name").is_in(
        k.select(pl.col("name").unique()).filter(pl.col("name").str.contains(TENSOR_CORE_PATTERN)).get_column("name").implode()
    ).alias("tc"))
    per_root = k.filter(pl.col("rid").is_not_null()).group_by("rid").agg(
        pl.col("dur_ns").sum().alias("gpu_ns"), pl.len().cast(pl.Int64).alias("kernels"), pl.col("tc").any().alias("tensor_cores"))

    # unmodelled: under a known operator the formula could not take, else the launching operator
    left = k.filter(pl.col("rid").is_null())
    failed = outer.select(pl.col("cid").alias("oid"), pl.col("name").alias("_oname"), pl.col("why").alias("_owhy"))
    # the launching operators of these kernels only (of every operator: 75 MiB at the 1 GB trace's peak)
    launched = left.get_column("external_id").drop_nulls().unique().implode()
    launcher = (host.lazy().filter(pl.col("cat").is_in(["cpu_op", "user_annotation"]) & pl.col("external_id").is_in(launched))
                .select("external_id", pl.col("name").alias("_lname")).unique("external_id", keep="first", maintain_order=True)
                .collect())  # fmt: skip
    left = left.join(failed, on="oid", how="left").join(launcher, on="external_id", how="left")
    unmodelled = (
        left.with_columns(
            pl.coalesce("_oname", "_lname", pl.lit("(no operator)")).alias("op"),
            pl.when(pl.col("_oname").is_not_null()).then(pl.col("_owhy"))
            .when(pl.col("_lname").is_not_null()).then(pl.lit("not in the model"))
            .otherwise(pl.lit("its launch is under no operator")).alias("reason"))
        .group_by("op", "reason").agg(pl.len().cast(pl.Int64).alias("kernels"), pl.col("dur_ns").sum().alias("gpu_ns"))
        .sort("gpu_ns", "op", "reason", descending=[True, False, False], nulls_last=True)
        .select(list(UNMODELLED_SCHEMA)).cast(UNMODELLED_SCHEMA)
    )  # fmt: skip

    # recomputation: a forward operator (it has an autograd sequence number) run inside the
    # backward pass, which only activation checkpointing does
    ranges = _outermost(host.filter((pl.col("cat") == "cpu_op") & pl.col("name").str.starts_with(_EVALUATE))
                        .select("tid", "start_ns", "end_ns").with_row_index("bid"))
    roots = _place(roots, ranges.select("tid", "start_ns", "end_ns", pl.col("bid").cast(pl.Int64)), "start_ns", "bid")
    roots = roots.with_columns((pl.col("bid").is_not_null() & pl.col("sequence").is_not_null() & (pl.col("cls") != "optimizer"))
                               .alias("recompute"))
    step = _step_of(roots["start_ns"].to_numpy(), trace.steps) if trace.steps.height else np.full(roots.height, -1)
    roots = roots.with_columns(pl.Series("step", step, dtype=pl.Int64)).with_columns(
        pl.when(pl.col("step") >= 0).then(pl.col("step")).alias("step"))
    roots = roots.join(per_root, left_on="cid", right_on="rid", how="left").with_columns(
        pl.col("gpu_ns").fill_null(0), pl.col("kernels").fill_null(0), pl.col("tensor_cores").fill_null(False))
    roots = _optimizer_bytes(roots, host, trace, notes)
    out = roots.select(pl.col("name").alias("op"), *(c for c in OP_SCHEMA if c != "op")).cast(OP_SCHEMA)
    return OperatorTable(out, unmodelled, kernel_ns, outside_ns, shapes, tuple(notes))


def _optimizer_bytes(roots: pl.DataFrame, host: pl.DataFrame, trace: Trace, notes: list[str]) -> pl.DataFrame:
    """Each optimizer step's bytes: the parameters whose gradients ``AccumulateGrad``
    received in its host step, times the passes its update makes (see the module)."""
    is_opt = pl.col("cls") == "optimizer"
    if roots.filter(is_opt).height == 0:
        return roots
    acc = host.filter((pl.col("cat") == "cpu_op") & (pl.col("name") == _ACCUMULATE)).select("start_ns", "input_types", "input_dims")
    if acc.height == 0 or acc.get_column("input_dims").null_count() == acc.height or not trace.steps.height:
        notes.append("optimizer bytes: no AccumulateGrad shapes in the steps (record_shapes off): its time is counted, its bytes not")
        return roots
    per_sig = acc.select("input_types", "input_dims").unique()
    size, dtype = [], []
    for types, dims in per_sig.iter_rows():
        try:
            t0, d0 = types.split(",")[0], json.loads(dims)[0]
            size.append(math.prod(d0) * DTYPES[t0][1])
            dtype.append(DTYPES[t0][0])
        except (AttributeError, ValueError, TypeError, KeyError, IndexError):
            size.append(None)
            dtype.append(None)
    per_sig = per_sig.with_columns(pl.Series("_b", size, dtype=pl.Int64), pl.Series("_dt", dtype, dtype=pl.String))
    acc = acc.join(per_sig, on=["input_types", "input_dims"], how="left", nulls_equal=True)
    acc = acc.with_columns(pl.Series("step", _step_of(acc["start_ns"].to_numpy(), trace.steps)))
    params = acc.filter(pl.col("step") >= 0).group_by("step").agg(
        pl.col("_b").sum().alias("_param_bytes"), pl.col("_b").null_count().alias("_unknown"),
        pl.col("_dt").sort_by(["_b", "_dt"], descending=[True, False], nulls_last=True).first().alias("_param_dtype"))  # (the gradients': the parameters')
    kind = pl.col("name").str.extract(OPTIMIZER_RANGE)
    passes = kind.replace_strict(_OPTIMIZER_PASSES, default=MIN_OPTIMIZER_PASSES, return_dtype=pl.Int64)
    unknown = sorted(set(roots.filter(is_opt).select(kind.alias("k")).get_column("k").drop_nulls().to_list()) - set(_OPTIMIZER_PASSES))
    if unknown:
        notes.append(f"optimizer bytes: {', '.join(unknown)} not in the model; counted as the least an update moves "
                     f"({MIN_OPTIMIZER_PASSES} passes over the parameters: read them and their gradients, write them)")
    several = roots.filter(is_opt).group_by("step").len().filter(pl.col("len") > 1).get_column("step").to_list()
    if several:
        notes.append("optimizer bytes: several optimizers step in one step; which parameters each updates is not in "
                     "the trace, so their bytes are not counted")
    roots = roots.join(params, on="step", how="left")
    ok = is_opt & pl.col("_param_bytes").is_not_null() & (pl.col("_unknown") == 0) & ~pl.col("step").is_in(several)
    notes.append("optimizer bytes: the parameters that received a gradient in the step (AccumulateGrad), times the "
                 "tensors the update reads and writes per parameter; with gradient accumulation over k micro-batches "
                 "each parameter is counted k times")
    return roots.with_columns(pl.when(ok).then(pl.col("_param_bytes") * passes).otherwise(pl.col("bytes")).alias("bytes"),
                              pl.when(is_opt & ok).then(pl.col("_param_dtype")).otherwise(pl.col("dtype")).alias("dtype")
                              ).drop("_param_bytes", "_unknown", "_param_dtype")
