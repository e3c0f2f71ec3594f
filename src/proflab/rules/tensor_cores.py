"""FP32 matrix math that leaves the tensor cores idle.

Detection: GEMM kernels whose names carry no tensor-core tile (tf32, bf16, hmma, ...), and
that either are named as FP32 SIMT GEMMs or were launched by an operator with float32 inputs
(when the trace has ``record_shapes``). The method used is stated in the finding.
"""

from __future__ import annotations

import polars as pl

from proflab.analysis.context import Context
from proflab.analysis.devices import datasheet_peaks
from proflab.model import Trace
from proflab.model.findings import Finding
from proflab.rules._common import MIN_GAIN_PCT, gain_finding, ms, pct

__all__ = ["tensor_cores_unused", "ASSUMED_SPEEDUP"]

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
    return [
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
            assumption=f"tensor-core GEMMs run at least {ASSUMED_SPEEDUP:g}x faster than these FP32 ones",
        )
    ]
