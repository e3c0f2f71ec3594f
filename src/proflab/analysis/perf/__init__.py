"""Where the FLOPs go: every operator's FLOPs and bytes from the trace, against the device's
roofline, and the model FLOPs utilisation of each step.

For each modelled operator call (``table``: its kernels' GPU time; ``_formulas``: its FLOPs
and bytes from the recorded shapes) the roofline gives an *ideal* time: its executed FLOPs at
the dense datasheet peak of its dtype (the tensor cores' for GEMMs, convolutions and
attention: BF16, FP16, FP8, TF32 where its kernels are tensor-core ones, FP32 on the CUDA
cores where not; the CUDA cores' FP32 peak for everything else), or its bytes at the HBM
bandwidth, whichever is longer. That roof bounds it (``compute`` or ``memory``); the time
above it is *lost* (``lost_ms``): what a kernel at the roof would save. Ranked by lost time,
the operators say where a better kernel pays.

Per step: **MFU** is the model FLOPs (attention counted dense, recomputed operators not
counted) over the GPU-side step time and the matrix peak of the dtype that does most of the
FLOPs; **HFU** the executed FLOPs (causal attention's unmasked part, recomputation included)
over the same. Both are against the datasheet, labelled so, and both count only what the
model knows: the GPU time it does not model is listed with its share (``unmodelled``).

Where the trace has no shapes (``proflab run`` records none by default), the FLOPs of one
unprofiled step counted by ``torch.utils.flop_counter`` in the profiled process (``counted``)
give the per-step FLOPs, MFU and each class's FLOPs; the trace's operators still give each
class its time.

All times in ns inside; the dictionaries ``to_dict`` gives use ms, TFLOPS (10^12 FLOP/s),
GB/s (10^9 bytes/s) and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from proflab.analysis.devices import DevicePeaks
from proflab.analysis.perf._formulas import CLASSES, MATRIX_CLASSES, Cost, causal_fraction, cost, op_class
from proflab.analysis.perf.table import OP_SCHEMA, UNMODELLED_SCHEMA, OperatorTable, operator_table

__all__ = ["CLASSES", "MATRIX_CLASSES", "Cost", "Counted", "Perf", "causal_fraction", "combined", "cost", "counted_from", "op_class",
           "operator_table", "perf_for", "perf_of", "OP_SCHEMA", "UNMODELLED_SCHEMA", "TOP_OPS"]

TOP_OPS = 15
_TORCH_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32", "torch.float64": "fp64",
                 "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8", "torch.float8_e4m3fnuz": "fp8",
                 "torch.float8_e5m2fnuz": "fp8"}  # fmt: skip


@dataclass(frozen=True)
class Counted:
    """FLOPs of one training step counted outside the profiler (``proflab run``:
    ``torch.utils.flop_counter`` over one unprofiled step). ``by_op``: FLOPs by operator
    (``aten::mm``); ``by_dtype``: by the dtype of the operator's first input ("bf16"...);
    ``matmul_tf32``: FP32 matrix products were allowed TF32 when counted."""

    total: int
    by_op: dict[str, int]
    by_dtype: dict[str, int]
    matmul_tf32: bool | None
    source: str
    by_module: dict[str, int] = field(default_factory=dict)


def counted_from(doc: dict | None) -> Counted | None:
    """A :class:`Counted` from a run directory's ``flops`` record (``processes/<pid>.json``);
    None when absent, failed or empty."""
    if not isinstance(doc, dict) or not isinstance(doc.get("total"), int) or doc["total"] <= 0:
        return None
    by_op = {str(k).replace("aten.", "aten::", 1) if str(k).startswith("aten.") else str(k): int(v)
             for k, v in (doc.get("by_op") or {}).items() if isinstance(v, int)}
    by_dtype: dict[str, int] = {}
    for k, v in (doc.get("by_dtype") or {}).items():
        if isinstance(v, int):
            d = _TORCH_DTYPES.get(str(k), str(k))
            by_dtype[d] = by_dtype.get(d, 0) + v
    tf32 = doc.get("matmul_tf32")
    return Counted(doc["total"], by_op, by_dtype, tf32 if isinstance(tf32, bool) else None,
                   str(doc.get("source") or "torch.utils.flop_counter"),
                   {str(k): int(v) for k, v in (doc.get("by_module") or {}).items() if isinstance(v, int)})


def _r(v: float | None, nd: int = 3) -> float | None:
    return None if v is None or not np.isfinite(v) else round(float(v), nd)


@dataclass(frozen=True)
class Perf:
    """The operator performance model of one trace. ``ops``: the modelled operator calls
    summed per signature (operator, input shapes, dtype) and step (``_KEYS``: with their roof,
    ``peak_flops`` FLOP/s, and bound; the sums ``count``, ``kernels``, ``gpu_ns``, ``flops``,
    ``exec_flops``, ``bytes``, ``ideal_ns``, ``lost_ns``); ``unmodelled``: GPU time no
    modelled operator holds; ``steps``: per step, ``model_flops``, ``exec_flops``,
    ``step_ns`` (GPU-side) and ``mfu_pct``/``hfu_pct``. ``missing``: why FLOPs, peaks or
    steps are not there (empty when they are)."""

    ops: pl.DataFrame  # the calls per signature and step (``_aggregate``)
    unmodelled: pl.DataFrame
    steps: pl.DataFrame
    kernel_ns: int
    outside_ns: int
    flop_source: str | None
    peaks: DevicePeaks | None
    mfu_dtype: str | None
    counted: Counted | None = None
    unprofiled_step_ms: tuple[float, float] | None = None
    unprofiled_source: str | None = None
    notes: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()

    # -- per class, per operator -----------------------------------------------------------
    def classes(self) -> pl.DataFrame:
        """One row per operator class (see :func:`_summary`), most time first."""
        return _summary(self.ops, ["cls"], self.kernel_ns, self._hbm, self.counted_class_flops())

    def top(self, n: int = TOP_OPS) -> pl.DataFrame:
        """The operators (name, input shapes, dtype) that lose the most time to their roof."""
        s = _summary(self.ops, ["signature", "op", "cls"], self.kernel_ns, self._hbm)
        return s.sort([pl.col("lost_ns").fill_null(-1), "time_ns", pl.col("flops").fill_null(-1), "signature"],
                      descending=[True, True, True, False]).head(n)

    @property
    def _hbm(self) -> float | None:
        return self.peaks.hbm_gbps if self.peaks is not None else None

    def counted_class_flops(self) -> dict[str, int] | None:
        """FLOPs per class over the window from the counted step (no shapes in the trace):
        the counted step's FLOPs times the steps."""
        if self.counted is None or self.flop_source is None or not self.flop_source.startswith("torch.utils.flop_counter"):
            return None
        n = self.steps.height or 1
        out: dict[str, int] = {}
        for op, f in self.counted.by_op.items():
            c = op_class(op) or "other"
            out[c] = out.get(c, 0) + f * n
        return out

    # -- the report section ----------------------------------------------------------------
    def to_dict(self, top: int = TOP_OPS) -> dict[str, Any]:
        classes = self.classes()
        modelled = int(self.ops.get_column("gpu_ns").sum()) if self.ops.height else 0
        unmod = int(self.unmodelled.get_column("gpu_ns").sum()) if self.unmodelled.height else 0
        total = max(self.kernel_ns, 1)
        return {
            "flop_source": self.flop_source,
            "peaks": _peaks_dict(self.peaks),
            "coverage": {
                "kernel_ms": _r(self.kernel_ns / 1e6), "modelled_ms": _r(modelled / 1e6), "unmodelled_ms": _r(unmod / 1e6),
                "modelled_pct": _r(100 * modelled / total, 2) if self.kernel_ns else None,
                "outside_steps_ms": _r(self.outside_ns / 1e6),
            },
            "per_step": self._per_step_dict(),
            "classes": [_row_dict(r) for r in classes.iter_rows(named=True)],
            "top_ops": [_row_dict(r) for r in self.top(top).iter_rows(named=True)],
            "unmodelled": [{"op": r["op"], "reason": r["reason"], "kernels": r["kernels"], "time_ms": _r(r["gpu_ns"] / 1e6),
                            "share_pct": _r(100 * r["gpu_ns"] / total, 2)}
                           for r in self.unmodelled.head(20).iter_rows(named=True)],  # fmt: skip
            "modules": dict(sorted(self.counted.by_module.items(), key=lambda kv: -kv[1])[:20]) if self.counted else {},
            "notes": list(self.notes),
            "missing": list(self.missing),
        }

    def _per_step_dict(self) -> dict[str, Any]:
        s = self.steps
        peak = self.peaks.matrix_tflops(self.mfu_dtype) if self.peaks is not None and self.mfu_dtype else None
        out: dict[str, Any] = {"steps": s.height, "model_flops": None, "exec_flops": None, "step_ms": None,
                               "mfu_pct": None, "hfu_pct": None,
                               "mfu_peak": {"dtype": self.mfu_dtype, "tflops": peak,
                                            "source": f"datasheet ({self.peaks.model}), dense" if peak else None},
                               "unprofiled_step_ms": None, "mfu_unprofiled_pct": None, "rows": []}  # fmt: skip
        if not s.height:
            return out

        def med(c: str) -> float | None:
            v = s.get_column(c).drop_nulls()
            return float(v.median()) if len(v) else None

        out.update(model_flops=_r(med("model_flops"), 0), exec_flops=_r(med("exec_flops"), 0),
                   step_ms=_r(med("step_ns") / 1e6) if med("step_ns") is not None else None,
                   mfu_pct=_r(med("mfu_pct"), 2), hfu_pct=_r(med("hfu_pct"), 2))
        mf = med("model_flops")
        if self.unprofiled_step_ms is not None and peak and mf:
            lo, hi = self.unprofiled_step_ms
            out["unprofiled_step_ms"] = [_r(lo), _r(hi)] if lo != hi else _r(lo)
            out["unprofiled_source"] = self.unprofiled_source
            mfu = [_r(100 * mf / (t / 1e3) / (peak * 1e12), 2) for t in (hi, lo)]
            out["mfu_unprofiled_pct"] = mfu if lo != hi else mfu[0]
        out["rows"] = [{"step": r["step"], "model_flops": r["model_flops"], "exec_flops": r["exec_flops"],
                        "step_ms": _r(r["step_ns"] / 1e6) if r["step_ns"] is not None else None,
                        "mfu_pct": _r(r["mfu_pct"], 2), "hfu_pct": _r(r["hfu_pct"], 2)}
                       for r in s.iter_rows(named=True)]  # fmt: skip
        return out


def _peaks_dict(p: DevicePeaks | None) -> dict[str, Any] | None:
    if p is None:
        return None
    m = {d: p.matrix_tflops(d) for d in ("fp8", "bf16", "fp16", "tf32", "fp64")}
    return {"device": p.model, "source": f"datasheet ({p.model}), dense", "hbm_gbps": p.hbm_gbps,
            "vector_fp32_tflops": p.fp32_tflops, "matrix_tflops": {k: v for k, v in m.items() if v is not None}}


def _row_dict(r: dict[str, Any]) -> dict[str, Any]:
    out = {k: r[k] for k in ("signature", "op") if k in r}
    out.update({
        "class": r["cls"], "dtype": r["dtype"], "count": r["count"], "kernels": r["kernels"],
        "time_ms": _r(r["time_ns"] / 1e6), "share_pct": _r(r.get("share_pct"), 2),
        "flops": r["flops"], "exec_flops": r["exec_flops"], "bytes": r["bytes"],
        "achieved_tflops": _r(r["achieved_tflops"]), "achieved_gbps": _r(r["achieved_gbps"], 1),
        "intensity_flop_per_byte": _r(r["intensity"], 2), "bound": r["bound"], "roof": r["roof"],
        "roof_value": _r(r["roof_value"], 1), "roof_unit": r["roof_unit"],
        "ideal_ms": _r(r["ideal_ns"] / 1e6) if r["ideal_ns"] is not None else None,
        "lost_ms": _r(r["lost_ns"] / 1e6) if r["lost_ns"] is not None else None,
        "pct_of_roof": _r(r["pct_of_roof"], 1),
    })
    return out


def _number_text(x: pl.Expr) -> pl.Expr:
    """989.0 as "989", 1307.4 as "1307.4": a datasheet figure as the datasheet writes it."""
    return pl.when(x == x.floor()).then(x.cast(pl.Int64).cast(pl.String)).otherwise(x.round(1).cast(pl.String))


def _with_roof(ops: pl.DataFrame, peaks: DevicePeaks | None) -> pl.DataFrame:
    """Each call's roofs: its compute peak (FLOP/s: the matrix peak of its dtype for GEMMs,
    convolutions and attention, FP32 as TF32 where its kernels are tensor-core ones; the
    CUDA cores' FP32 peak for the rest), the HBM bandwidth, its ideal time and bound."""
    if peaks is None or ops.height == 0:
        return ops.with_columns(pl.lit(None, dtype=pl.Float64).alias("peak_flops"), pl.lit(None, dtype=pl.String).alias("roof"),
                                pl.lit(None, dtype=pl.Float64).alias("ideal_ns"), pl.lit(None, dtype=pl.String).alias("bound"))
    matrix = pl.col("cls").is_in(list(MATRIX_CLASSES))
    dt = (pl.when(matrix & (pl.col("dtype") == "fp32") & pl.col("tensor_cores")).then(pl.lit("tf32"))
          .when(matrix).then(pl.col("dtype")).otherwise(pl.lit("vector")))  # fmt: skip
    table = {d: peaks.matrix_tflops(d) for d in ("bf16", "fp16", "fp8", "tf32", "fp32", "fp64")}
    table["vector"] = peaks.fp32_tflops
    tf = dt.replace_strict({k: float(v) for k, v in table.items() if v is not None}, default=None, return_dtype=pl.Float64)
    label = (pl.when(dt == "vector").then(pl.lit(f"FP32 vector {peaks.fp32_tflops:g} TFLOPS"))
             .when(dt == "fp32").then(pl.lit(f"FP32 {peaks.fp32_tflops:g} TFLOPS (no tensor cores)"))
             .otherwise(pl.format("{} tensor {} TFLOPS", dt.str.to_uppercase(), _number_text(tf))))  # fmt: skip
    bw = peaks.hbm_gbps * 1e9
    t_c = pl.col("exec_flops") / pl.col("peak_flops")
    t_m = pl.col("bytes") / bw
    bound = (pl.when(t_c.is_null() & t_m.is_null()).then(None)
             .when(t_c.fill_null(0) >= t_m.fill_null(0)).then(pl.lit("compute")).otherwise(pl.lit("memory")))  # fmt: skip
    return (ops.with_columns((tf * 1e12).alias("peak_flops"), label.alias("_compute_roof"))
            .with_columns(pl.max_horizontal(t_c, t_m).mul(1e9).alias("ideal_ns"), bound.alias("bound"))
            .with_columns(pl.when(pl.col("bound") == "memory").then(pl.lit(f"HBM {peaks.hbm_gbps:g} GB/s"))
                          .when(pl.col("bound") == "compute").then(pl.col("_compute_roof")).alias("roof"))
            .drop("_compute_roof"))  # fmt: skip


# the calls of one operator signature in one step, as the model keeps them (``Perf.ops``)
_KEYS = ["op", "cls", "signature", "dtype", "step", "recompute", "tensor_cores", "roof", "bound", "peak_flops"]


def _aggregate(calls: pl.DataFrame) -> pl.DataFrame:
    """Calls summed per ``_KEYS``: what every summary reads, exactly, in a table as small as
    the model's distinct calls per step (and summable across the parts of a trace). The
    ``timed_*`` sums are over the calls that ran kernels; the lost time is each call's own."""
    timed = pl.col("gpu_ns") > 0
    known_f = pl.col("exec_flops").is_not_null() & timed
    known_b = pl.col("bytes").is_not_null() & timed
    return calls.group_by(_KEYS).agg(
        pl.len().cast(pl.Int64).alias("count"),
        pl.col("kernels").sum(),
        pl.col("gpu_ns").sum(),
        *(pl.when(pl.col(c).null_count() == 0).then(pl.col(c).sum()).alias(c) for c in ("flops", "exec_flops", "bytes")),
        pl.col("exec_flops").filter(known_f).sum().alias("timed_flops"),
        pl.col("gpu_ns").filter(known_f).sum().alias("timed_flops_ns"),
        pl.col("bytes").filter(known_b).sum().alias("timed_bytes"),
        pl.col("gpu_ns").filter(known_b).sum().alias("timed_bytes_ns"),
        pl.col("ideal_ns").filter(timed).sum().alias("ideal_ns"),
        pl.col("ideal_ns").filter(timed).null_count().cast(pl.Int64).alias("untimed_ideal"),
        (pl.col("gpu_ns") - pl.col("ideal_ns")).clip(lower_bound=0).filter(timed).sum().alias("lost_ns"),
        timed.sum().cast(pl.Int64).alias("timed_calls"),
    )


def _summary(ops: pl.DataFrame, by: list[str], kernel_ns: int, hbm_gbps: float | None,
             flops_override: dict[str, int] | None = None) -> pl.DataFrame:
    """Calls grouped by ``by``: count, kernels, time, FLOPs, bytes, achieved TFLOPS (executed
    FLOPs over the time of the calls whose FLOPs are known) and GB/s (likewise), arithmetic
    intensity, the roof that bounds most of the group's time and its value, the ideal and
    the lost time (summed per call: each call against its own roof)."""
    g = ops.group_by(by).agg(
        pl.col("count", "kernels").sum(),
        pl.col("gpu_ns").sum().alias("time_ns"),
        *(pl.when(pl.col(c).null_count() == 0).then(pl.col(c).sum()).alias(c) for c in ("flops", "exec_flops", "bytes")),
        pl.col("timed_flops", "timed_flops_ns", "timed_bytes", "timed_bytes_ns", "ideal_ns", "untimed_ideal", "lost_ns",
               "timed_calls").sum(),
        pl.col("dtype").sort_by(["gpu_ns", "count", "dtype"], descending=[True, True, False], nulls_last=True).first().alias("dtype"),
    )
    # the roof that bounds most of each group's time (each call is held to its own)
    roofs = (ops.filter(pl.col("bound").is_not_null()).group_by(*by, "bound", "roof")
             .agg(pl.col("gpu_ns").sum().alias("_t"), pl.col("peak_flops").first().alias("_peak"))
             .sort("_t", "roof", descending=[True, False]).unique(by, keep="first").drop("_t"))  # fmt: skip
    g = g.join(roofs, on=by, how="left", nulls_equal=True) if roofs.height else g.with_columns(
        pl.lit(None, dtype=pl.String).alias("bound"), pl.lit(None, dtype=pl.String).alias("roof"),
        pl.lit(None, dtype=pl.Float64).alias("_peak"))
    if flops_override and "cls" in by:
        over = pl.col("cls").replace_strict(flops_override, default=None, return_dtype=pl.Int64)
        g = g.with_columns(over.alias("flops"), over.alias("timed_flops"),
                           pl.when(over.is_not_null()).then(pl.col("time_ns")).alias("timed_flops_ns"))
    ideal_known = (pl.col("untimed_ideal") == 0) & (pl.col("timed_calls") > 0)
    return g.with_columns(
        pl.when(pl.col("timed_flops_ns") > 0).then(pl.col("timed_flops") / pl.col("timed_flops_ns") / 1e3).alias("achieved_tflops"),
        pl.when(pl.col("timed_bytes_ns") > 0).then(pl.col("timed_bytes") / pl.col("timed_bytes_ns")).alias("achieved_gbps"),
        pl.when(pl.col("bytes") > 0).then(pl.coalesce("exec_flops", "flops") / pl.col("bytes")).alias("intensity"),
        pl.when(ideal_known).then(pl.col("ideal_ns")).alias("ideal_ns"),
        pl.when(ideal_known).then(pl.col("lost_ns")).alias("lost_ns"),
        (100 * pl.col("time_ns") / max(kernel_ns, 1)).alias("share_pct"),
        pl.when(pl.col("bound") == "memory").then(pl.lit("GB/s")).when(pl.col("bound") == "compute").then(pl.lit("TFLOPS"))
        .alias("roof_unit"),
    ).with_columns(
        pl.when(pl.col("bound") == "compute").then(pl.col("_peak") / 1e12)
        .when(pl.col("bound") == "memory").then(pl.lit(hbm_gbps, dtype=pl.Float64)).alias("roof_value"),
        pl.when(ideal_known & (pl.col("time_ns") > 0)).then(100 * pl.col("ideal_ns") / pl.col("time_ns")).alias("pct_of_roof"),
    ).sort(["time_ns", pl.col("flops").fill_null(-1), *by], descending=[True, True, *([False] * len(by))]).drop(
        "timed_flops", "timed_flops_ns", "timed_bytes", "timed_bytes_ns", "untimed_ideal", "timed_calls", "_peak")


def _mfu_dtype(ops: pl.DataFrame, counted: Counted | None) -> str | None:
    """The dtype that does most of the model's matrix FLOPs ("tf32" for FP32 on tensor cores)."""
    if counted is not None and counted.by_dtype:
        d = max(counted.by_dtype, key=lambda k: counted.by_dtype[k])
        return "tf32" if d == "fp32" and counted.matmul_tf32 else d
    m = ops.filter(pl.col("cls").is_in(list(MATRIX_CLASSES)) & pl.col("flops").is_not_null() & pl.col("dtype").is_not_null())
    if m.height == 0:
        return None
    m = m.with_columns(pl.when((pl.col("dtype") == "fp32") & pl.col("tensor_cores")).then(pl.lit("tf32"))
                       .otherwise(pl.col("dtype")).alias("dtype"))
    return m.group_by("dtype").agg(pl.col("flops").sum()).sort("flops", "dtype", descending=[True, False])["dtype"][0]


def perf_of(table: OperatorTable, *, peaks: DevicePeaks | None, gpu_steps: pl.DataFrame | None = None,
            host_steps: pl.DataFrame | None = None, counted: Counted | None = None,
            unprofiled_step_ms: tuple[float, float] | None = None, unprofiled_source: str | None = None,
            missing: tuple[str, ...] = ()) -> Perf:
    """The model over one trace's operator table. ``gpu_steps``: GPU-side steps (``step``,
    ``device``, ``dur_ns``; the device with the most steps is used); ``host_steps``: the
    trace's steps (for a trace without GPU work); ``counted``: FLOPs counted outside the
    profiler, used where the trace has no shapes."""
    missing_l = list(missing)
    ops = _aggregate(_with_roof(table.ops, peaks))
    source = None
    if table.shapes and ops.filter(pl.col("flops").is_not_null() & (pl.col("cls") != "optimizer")).height:
        source = "shapes: each operator's recorded inputs (record_shapes)"
    elif counted is not None:
        source = f"{counted.source} (no shapes in the trace)"
    else:
        missing_l.append("FLOPs: the trace has no input shapes (record_shapes off) and no counted step beside it; "
                         "proflab run counts one unprofiled step's FLOPs, or record with --record-shapes")
    dtype = _mfu_dtype(ops, counted if source and source.startswith("torch.utils") else None)
    steps = _steps(ops, table, gpu_steps, host_steps, peaks, dtype, counted if source and source.startswith("torch.utils") else None)
    if peaks is None and not any(m.startswith("GPU activity") for m in missing_l):
        missing_l.append("datasheet peaks for this device: no roofs, ideal times or MFU")
    return Perf(ops, table.unmodelled, steps, table.kernel_ns, table.outside_ns, source, peaks, dtype,
                counted if source else None, unprofiled_step_ms, unprofiled_source, table.notes, tuple(missing_l))


_STEP_SCHEMA = {"step": pl.Int64, "model_flops": pl.Int64, "exec_flops": pl.Int64, "step_ns": pl.Int64,
                "mfu_pct": pl.Float64, "hfu_pct": pl.Float64}


def _steps(ops: pl.DataFrame, table: OperatorTable, gpu_steps: pl.DataFrame | None, host_steps: pl.DataFrame | None,
           peaks: DevicePeaks | None, dtype: str | None, counted: Counted | None) -> pl.DataFrame:
    if gpu_steps is not None and gpu_steps.height:
        dev = gpu_steps.group_by("device").len().sort("len", "device", descending=[True, False])["device"][0]
        st = gpu_steps.filter(pl.col("device") == dev).select("step", pl.col("dur_ns").alias("step_ns"))
    elif host_steps is not None and host_steps.height:
        st = host_steps.select("step", (pl.col("end_ns") - pl.col("start_ns")).alias("step_ns"))
    else:
        return pl.DataFrame(schema=_STEP_SCHEMA)
    if counted is not None:
        st = st.with_columns(pl.lit(counted.total, dtype=pl.Int64).alias("model_flops"),
                             pl.lit(None, dtype=pl.Int64).alias("exec_flops"))
    elif table.shapes:
        per = ops.filter(pl.col("step").is_not_null()).group_by("step").agg(
            pl.col("flops").filter(~pl.col("recompute")).sum().alias("model_flops"),
            pl.col("exec_flops").sum().alias("exec_flops"))
        st = st.join(per, on="step", how="left")
    else:
        st = st.with_columns(pl.lit(None, dtype=pl.Int64).alias("model_flops"), pl.lit(None, dtype=pl.Int64).alias("exec_flops"))
    peak = peaks.matrix_tflops(dtype) if peaks is not None and dtype else None
    has_gpu = gpu_steps is not None and gpu_steps.height > 0
    if peak and has_gpu:
        st = st.with_columns((100 * pl.col(c) / (pl.col("step_ns") / 1e9) / (peak * 1e12)).alias(n)
                             for c, n in (("model_flops", "mfu_pct"), ("exec_flops", "hfu_pct")))
    else:
        st = st.with_columns(pl.lit(None, dtype=pl.Float64).alias("mfu_pct"), pl.lit(None, dtype=pl.Float64).alias("hfu_pct"))
    return st.select(list(_STEP_SCHEMA)).cast(_STEP_SCHEMA).sort("step")


def perf_for(ctx, *, counted: Counted | None = None) -> Perf:
    """The model over an analysis context (``analysis.context.Context``): its launches, its
    GPU-side steps, its device's datasheet peaks and its unprofiled step (measured where the
    context was given one, else the observer's estimate)."""
    from proflab.analysis.devices import datasheet_peaks

    trace = ctx.trace
    table = operator_table(trace, ctx.launches)
    info = ctx.device_info or {} if trace.has_gpu else {}
    peaks = datasheet_peaks(info.get("name"), info.get("sm_count")) if trace.has_gpu else None
    missing = () if trace.has_gpu else ("GPU activity: FLOPs and bytes only, no time, roofs or MFU",)
    obs = ctx.observer if trace.has_gpu else None
    unprofiled = obs.unprofiled_step_ms if obs is not None else None
    return perf_of(table, peaks=peaks if trace.has_gpu else None, gpu_steps=ctx.gpu_steps if trace.has_gpu else None,
                   host_steps=trace.steps, counted=counted, unprofiled_step_ms=unprofiled,
                   unprofiled_source=obs.source if obs is not None else None, missing=missing)


def combined(parts: list[Perf]) -> Perf | None:
    """One model over the consecutive parts of a trace analysed in parts: their summed calls,
    unmodelled time and kernel time, and their steps (each step is whole in one part)."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    first = parts[0]
    ops = pl.concat([p.ops for p in parts], how="vertical_relaxed")
    sums = [c for c in ops.columns if c not in _KEYS]
    ops = ops.group_by(_KEYS).agg(*(pl.when(pl.col(c).null_count() == 0).then(pl.col(c).sum()).alias(c)
                                    if c in ("flops", "exec_flops", "bytes") else pl.col(c).sum() for c in sums))
    un = pl.concat([p.unmodelled for p in parts], how="vertical_relaxed")
    un = (un.group_by("op", "reason").agg(pl.col("kernels", "gpu_ns").sum())
          .sort("gpu_ns", "op", "reason", descending=[True, False, False], nulls_last=True)
          .select(list(UNMODELLED_SCHEMA)).cast(UNMODELLED_SCHEMA))  # fmt: skip
    steps = pl.concat([p.steps for p in parts], how="vertical_relaxed").unique("step", keep="first").sort("step")
    source = next((p.flop_source for p in parts if p.flop_source), None)
    missing = tuple(dict.fromkeys(m for p in parts for m in p.missing if not (source and m.startswith("FLOPs:"))))
    return Perf(ops, un, steps, sum(p.kernel_ns for p in parts), sum(p.outside_ns for p in parts), source, first.peaks,
                _mfu_dtype(ops, first.counted if source and source.startswith("torch.utils") else None),
                first.counted, first.unprofiled_step_ms, first.unprofiled_source,
                tuple(dict.fromkeys(n for p in parts for n in p.notes)), missing)
