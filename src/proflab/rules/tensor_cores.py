"""FP32 matrix math that leaves the tensor cores idle.

Detection: GEMM kernels whose names carry no tensor-core tile (tf32, bf16, hmma, ...), and
that either are named as FP32 SIMT GEMMs or were launched by an operator with float32 inputs
(when the trace has ``record_shapes``). The method used is stated in the finding.
"""

from __future__ import annotations

import re

import polars as pl

from proflab.analysis.context import Context
from proflab.analysis.devices import datasheet_peaks
from proflab.model import Trace
from proflab.model.findings import Finding, Fix
from proflab.rules._common import MIN_GAIN_PCT, gain_finding, keep, ms, pct, predicted, with_try

__all__ = ["tensor_cores_unused", "tensor_cores_tf32", "ASSUMED_SPEEDUP", "BF16_ELEMENTWISE_FACTOR"]

# Conservative: TF32/BF16 tensor-core GEMMs beat FP32 SIMT by 2x or more on every
# generation since Ampere (the datasheet ratio is 7-8x; real kernels rarely reach it).
ASSUMED_SPEEDUP = 2.0


def tensor_cores_unused(trace: Trace, ctx: Context) -> list[Finding]:
    if not trace.has_gpu:
        return []
    cc = ctx.device_info.get("compute_major")
    if cc is not None and cc < 8:
        return []  # no TF32 before Ampere; fp16 autocast advice would need accuracy review
    fp32 = ctx.fp32_gemms
    if fp32.height == 0:
        return []
    total = int(fp32["dur_ns"].sum())
    gain = int(total * (1 - 1 / ASSUMED_SPEEDUP))
    gain_pct = pct(gain, ctx.wall_ns, 2)
    if gain_pct < MIN_GAIN_PCT:
        return []
    by_name = bool(fp32["fp32_simt_by_name"].any())
    by_dtype = bool(fp32["op_fp32"].any())
    method = " and ".join(
        m for m, on in (("kernel names (heuristic)", by_name), ("operator input dtypes (record_shapes)", by_dtype)) if on
    )
    names = (
        fp32.group_by("name").agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True).head(5)["name"].to_list()
    )
    ops = fp32.drop_nulls("op").group_by("op").agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True)
    all_kernels = ctx.kernel_time_ns or 1
    peaks = datasheet_peaks(ctx.device_info.get("name"), ctx.device_info.get("sm_count"))
    evidence = {
        "fp32_gemm_ms": ms(total),
        "fp32_gemm_kernels": fp32.height,
        "share_of_kernel_time_pct": pct(total, all_kernels),
        "detected_by": method,
        "top_kernels": names,
    }
    if peaks and peaks.tf32_tflops:
        evidence["datasheet_fp32_tflops"] = peaks.fp32_tflops
        evidence["datasheet_tf32_tflops"] = peaks.tf32_tflops
    lines = ctx.frames.top_lines(fp32.select("tid", pl.col("launch_start_ns").alias("t_ns")))
    # the replay's speed-up: the datasheet's FP32 SIMT to TF32 tensor-core ratio, else the conservative one
    factor = peaks.fp32_tflops / peaks.tf32_tflops if peaks and peaks.tf32_tflops else 1 / ASSUMED_SPEEDUP
    pattern = "^(?:" + "|".join(re.escape(n) for n in fp32["name"].unique().to_list()) + ")$"
    f = predicted(
        gain_finding(
            "tensor_cores_unused",
            gain,
            ctx.wall_ns,
            title=(
                f"FP32 GEMMs without tensor cores: {ms(total, 2)} ms ({pct(total, all_kernels)}% of kernel time) "
                "in matmuls that TF32 or BF16 would run on tensor cores"
            ),
            evidence=evidence,
            fix=(
                "Enable TF32 for FP32 matmuls and convolutions: torch.set_float32_matmul_precision('high') "
                "(or torch.backends.cuda.matmul.allow_tf32 = True) and torch.backends.cudnn.allow_tf32 = True; "
                "better still, run the model under torch.autocast('cuda', dtype=torch.bfloat16)."
            ),
            where={"kernels": names, "ops": ops["op"].head(5).to_list(), "lines": lines},
            assumption=(f"these GEMMs run {1 / factor:.1f}x faster on TF32 tensor cores (the datasheet ratio)" if peaks and peaks.tf32_tflops
                        else f"tensor-core GEMMs run at least {ASSUMED_SPEEDUP:g}x faster than these FP32 ones"),
        ),
        ctx,
        Fix("speed_ops", pattern, factor=factor, label="TF32 matmuls"),
    )
    f = with_try(f, "tf32")
    return keep(f, ctx)


# Kernels of an FP32 model that run on TF32 tensor cores or in FP32 attention: under BF16 autocast
# they run at the BF16 rate (twice TF32's on every datasheet since Ampere).
_TF32_CORE = r"tf32|fmha_cutlass[FB]?_f32|attention.*f32"
_TF32_KERNEL = rf"(?i){_TF32_CORE}"
_NOT_TF32_KERNEL = rf"(?i)^(?!.*(?:{_TF32_CORE}))"
# What BF16 does to the rest of an FP32 model's kernels (elementwise, norms, reductions): half the
# bytes, plus the casts autocast adds. An FP32 LM on an H200 went 39.7 -> 21.0 ms a step under
# autocast, its TF32 GEMMs and FP32 attention at half their time, the rest at 0.6 (tests/data/gains).
BF16_ELEMENTWISE_FACTOR = 0.6
_MIN_TF32_SHARE_PCT = 20.0


def tensor_cores_tf32(trace: Trace, ctx: Context) -> list[Finding]:
    """An FP32 model whose matmuls already run on TF32 tensor cores: under BF16 autocast they
    (and FP32 attention) run at the BF16 rate, twice TF32's, and its elementwise kernels move
    half the bytes."""
    if not trace.has_gpu or ctx.fp32_gemms.height or not ctx.kernel_time_ns:
        return []  # FP32 SIMT GEMMs: tensor_cores_unused says it first
    peaks = datasheet_peaks(ctx.device_info.get("name"), ctx.device_info.get("sm_count"))
    if peaks is None or not peaks.tf32_tflops or not peaks.bf16_tflops:
        return []
    # (by name: the kernel rows are freed before the rules run, ``report.assemble``)
    tc = ctx.kernel_time_by_name.filter(pl.col("name").str.contains(_TF32_KERNEL))
    total = ctx.kernel_time_ns or 1
    share = pct(int(tc["dur_ns"].sum()), total)
    if share < _MIN_TF32_SHARE_PCT or not ctx.whatif.available:
        return []
    factor = peaks.tf32_tflops / peaks.bf16_tflops
    names = tc.group_by("name").agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True).head(5)["name"].to_list()
    f = predicted(
        gain_finding(
            "tensor_cores_unused",
            0,
            ctx.wall_ns,
            id="tensor_cores_tf32",
            title=(f"FP32 model on TF32 tensor cores: {share}% of kernel time in TF32 matmuls and FP32 attention, "
                   "which BF16 runs at twice the rate"),
            evidence={"tf32_kernel_ms": ms(int(tc["dur_ns"].sum())), "share_of_kernel_time_pct": share, "top_kernels": names,
                      "datasheet_tf32_tflops": peaks.tf32_tflops, "datasheet_bf16_tflops": peaks.bf16_tflops},
            fix=("Run forward and loss under torch.autocast('cuda', dtype=torch.bfloat16) (keep the optimizer in FP32); "
                 "attention then takes the flash kernels."),
            where={"kernels": names},
            assumption=(f"TF32 matmuls and FP32 attention take {factor:.2f}x their time in BF16 (datasheet ratio), the other "
                        f"kernels {BF16_ELEMENTWISE_FACTOR}x (half the bytes, plus casts)"),
        ),
        ctx,
        Fix("speed_ops", _TF32_KERNEL, factor=factor, label="bf16 autocast: matmuls"),
        Fix("speed_ops", _NOT_TF32_KERNEL, factor=BF16_ELEMENTWISE_FACTOR, label="bf16 autocast: the rest"),
    )
    return keep(f, ctx)
