"""FP32 matrix math that leaves the tensor cores idle.

Detection: GEMM kernels whose names carry no tensor-core tile (tf32, bf16, hmma, ...), and
that either are named as FP32 SIMT GEMMs or were launched by an operator with float32 inputs
(when the trace has ``record_shapes``). The method used is stated in the finding.
"""

from __future__ import annotations

import dataclasses
import re

import polars as pl

from proflab.analysis.context import Context
from proflab.analysis.devices import datasheet_peaks
from proflab.model import Trace
from proflab.model.findings import Finding, Fix
from proflab.rules._common import MIN_GAIN_PCT, gain_finding, keep, ms, pct, predicted, severity, steps_in_window, with_try

__all__ = ["tensor_cores_unused", "tensor_cores_tf32", "layout_conversions", "ASSUMED_SPEEDUP", "BF16_ELEMENTWISE_FACTOR"]

# Conservative: TF32/BF16 tensor-core GEMMs beat FP32 SIMT by 2x or more on every
# generation since Ampere (the datasheet ratio is 7-8x; real kernels rarely reach it).
ASSUMED_SPEEDUP = 2.0


def _fp32_gemms_material(ctx: Context) -> bool:
    """Whether the FP32 SIMT GEMMs would save a material share of the window on tensor cores
    (at ``ASSUMED_SPEEDUP``): what ``tensor_cores_unused`` reports before it replays."""
    total = int(ctx.fp32_gemms["dur_ns"].sum()) if ctx.fp32_gemms.height else 0
    return total > 0 and pct(int(total * (1 - 1 / ASSUMED_SPEEDUP)), ctx.wall_ns, 2) >= MIN_GAIN_PCT


def tensor_cores_unused(trace: Trace, ctx: Context) -> list[Finding]:
    if not trace.has_gpu:
        return []
    cc = ctx.device_info.get("compute_major")
    if cc is not None and cc < 8:
        return []  # no TF32 before Ampere; fp16 autocast advice would need accuracy review
    fp32 = ctx.fp32_gemms
    if not _fp32_gemms_material(ctx):
        return []
    total = int(fp32["dur_ns"].sum())
    gain = int(total * (1 - 1 / ASSUMED_SPEEDUP))
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
# they run against the BF16 roof (twice TF32's on every datasheet since Ampere). CUTLASS's
# ``tensorop_s1688gemm`` is its TF32 tensor-op GEMM for FP32 operands (cuBLAS and cuDNN call it
# without "tf32" in the name; its 16-bit kernels say ``tensorop_bf16_s1688``/``f16``).
_TF32_CORE = r"tf32|tensorop_s1688gemm|fmha_cutlass[FB]?_f32|attention.*f32"
_TF32_KERNEL = rf"(?i){_TF32_CORE}"
# ... of which PyTorch's memory-efficient attention in FP32 (``fmha_cutlassF_f32``/``B``): on
# compute capability 8.0 and later its GEMMs run CUTLASS's 3xTF32 (``OpMultiplyAddFastF32``, three
# TF32 products for each FP32 one), so its roof is a third of TF32's, and under BF16 autocast
# attention takes the flash kernels at the BF16 roof (the time they leave: the two roofs' ratio
# over ``_FAST_F32_PASSES``, 1/6 on an H100, at best)
_FP32_ATTENTION = r"fmha_cutlass[FB]?_f32"
_FP32_ATTENTION_KERNEL = rf"(?i){_FP32_ATTENTION}"
_TF32_MATMUL_KERNEL = rf"(?i)^(?!.*{_FP32_ATTENTION}).*(?:{_TF32_CORE})"
_FAST_F32_PASSES = 3
# Operators autocast runs in FP32 whatever their inputs (PyTorch's autocast op reference, "CUDA
# ops that can autocast to float32"): softmax and log_softmax, layer and group norm, the losses,
# exp, log, pow, rsqrt, reciprocal, softplus, cumulative sums and products, logsumexp. Their
# kernels, forward and backward, move the bytes they moved. By kernel name (``_AUTOCAST_FP32_KERNEL``)
# and by operator name (``_AUTOCAST_FP32_OP``, the per-op model's); ``sum`` is on the list too,
# but the sums autograd makes itself (a bias's gradient) run in the gradient's type, and a
# kernel's name does not tell the two apart: sums stay with the rest.
_AUTOCAST_FP32 = (r"softmax|layer_?norm|GammaBeta|group_?norm|nll_loss|cross_entropy|mse_loss|l1_loss|huber|"
                  r"binary_cross_entropy|kl_div|\bpow_|pow_tensor|\bexp_|expm1|\blog_|log10|log1p|log2|logsumexp|rsqrt|"
                  r"reciprocal|softplus|cumsum|cumprod|erfinv")
_AUTOCAST_FP32_KERNEL = rf"(?i){_AUTOCAST_FP32}"
_AUTOCAST_FP32_OP = (r"(?i)^aten::_*(?:native_)?(?:softmax|log_softmax|layer_norm|group_norm|nll_loss|cross_entropy|"
                     r"mse_loss|l1_loss|smooth_l1_loss|huber_loss|binary_cross_entropy|kl_div|pow|exp|expm1|log|log10|"
                     r"log1p|log2|logsumexp|rsqrt|reciprocal|softplus|cumsum|cumprod|erfinv)(?:_|$)")
# The rest that autocast moves: kernels whose names carry FP32 data (``<float>``, ``float,``) and
# no 16-bit type; not the optimizer's (the parameters and their state stay FP32), nor those of
# the operators autocast keeps in FP32
_OPTIMIZER_KERNEL = r"multi_tensor_apply|fused_adam|fused_sgd|FusedOptimizer"
_NOT_FP32 = r"bfloat16|half|bf16|fp16|f16"
_FP32_REST_KERNEL = rf"(?i)^(?!.*(?:{_TF32_CORE}|{_NOT_FP32}|{_OPTIMIZER_KERNEL}|{_AUTOCAST_FP32})).*\bfloat\b"
# What BF16 does to the rest of an FP32 model's kernels (elementwise, norms, reductions): at most
# half the bytes (their time halves), at least nothing (casts autocast adds eat it); a range.
BF16_ELEMENTWISE_FACTOR = (0.5, 1.0)
# cuDNN's tensor-core convolutions run NHWC: on a model in NCHW (PyTorch's default memory format)
# it transposes each convolution's tensors to NHWC and its outputs back, one kernel each way;
# in channels_last the convolutions take the tensors as they are and these kernels are gone.
_LAYOUT_KERNEL = r"(?i)nchwToNhwc|nhwcToNchw"
_MIN_TF32_SHARE_PCT = 20.0
# the share of the TF32 kernels' time the per-op model must hold for its factor to stand for them
_MIN_MODELLED_SHARE = 0.5


def _roof_factors(ctx: Context, peaks) -> dict[str, tuple[float, float]] | None:
    """Each kernel's achieved rate against its roof, carried to BF16 (the per-op model,
    ``analysis.perf``: FLOPs and bytes from the recorded shapes): per kernel group, ``tf32``
    (the matrix operators on TF32 tensor cores) and ``rest`` (every other modelled operator),
    the time BF16 leaves of their time, as (low, middle, high) factors. At the low factor (the most
    saved) a kernel keeps its share of the roof, and its time scales as its ideal time does
    (executed FLOPs at the BF16 tensor peak, or half its FP32 bytes at the HBM bandwidth,
    whichever is longer); at the high factor only its ideal time scales and the time it
    spends above its roof (latency, waves, launch) stays. A kernel far below its roof gains
    little; one at its roof the ratio of the roofs. The middle weighs the two by each
    operator's achieved share of its roof. None where the model holds too little of
    the TF32 kernels' time (no shapes: the trace cannot tell)."""
    from proflab.analysis.perf import MATRIX_CLASSES, perf_for

    ops = perf_for(ctx).ops
    if ops.height == 0 or peaks.bf16_tflops is None:
        return None
    bw = peaks.hbm_gbps * 1e9
    tf = pl.col("exec_flops").cast(pl.Float64)
    # (an FP32 operator's bytes halve in BF16, but for those autocast keeps in FP32)
    halves = (pl.col("dtype") == "fp32") & ~pl.col("op").str.contains(_AUTOCAST_FP32_OP)
    by = pl.col("bytes").cast(pl.Float64) * pl.when(halves).then(0.5).otherwise(1.0)
    modelled = ops.filter((pl.col("gpu_ns") > 0) & pl.col("ideal_ns").is_not_null() & (pl.col("ideal_ns") > 0))
    matrix = pl.col("cls").is_in(list(MATRIX_CLASSES)) & pl.col("tensor_cores") & (pl.col("dtype") == "fp32")
    ideal_bf16 = pl.max_horizontal((tf / (peaks.bf16_tflops * 1e12)).fill_null(0), (by / bw).fill_null(0)) * 1e9
    # the vector roof does not move for the rest: only their bytes halve
    ideal_rest = pl.max_horizontal((tf / (peaks.fp32_tflops * 1e12)).fill_null(0), (by / bw).fill_null(0)) * 1e9
    m = modelled.with_columns(
        pl.when(matrix).then(ideal_bf16).otherwise(ideal_rest).alias("_new_ideal"),
        pl.min_horizontal("ideal_ns", pl.col("gpu_ns").cast(pl.Float64)).alias("_ideal"),
    ).with_columns(
        (pl.col("gpu_ns") * pl.col("_new_ideal") / pl.col("ideal_ns")).alias("_keeps_share"),
        (pl.col("gpu_ns") - pl.col("_ideal") + pl.min_horizontal("_new_ideal", "_ideal")).alias("_above_stays"),
        (pl.col("_ideal") / pl.col("gpu_ns")).alias("_share"),
    ).with_columns(
        # each operator by its achieved share of its roof: at its roof it keeps that share,
        # far below it only its ideal time moves
        (pl.col("_share") * pl.col("_keeps_share") + (1 - pl.col("_share")) * pl.col("_above_stays")).alias("_by_share"),
    )
    tf32_ns = int(ctx.kernel_time_by_name.filter(pl.col("name").str.contains(_TF32_KERNEL))["dur_ns"].sum())
    out = {}
    for key, sel in (("tf32", matrix), ("rest", ~matrix)):
        part = m.filter(sel)
        gpu = float(part["gpu_ns"].sum())
        if key == "tf32" and (not tf32_ns or gpu < _MIN_MODELLED_SHARE * tf32_ns):
            return None
        if gpu <= 0:
            out[key] = (BF16_ELEMENTWISE_FACTOR[0], sum(BF16_ELEMENTWISE_FACTOR) / 2, BF16_ELEMENTWISE_FACTOR[1])
            continue
        out[key] = tuple(min(float(part[c].sum()) / gpu, 1.0) for c in ("_keeps_share", "_by_share", "_above_stays"))
    return out


# the operators whose parameters BF16 autocast casts (a linear's weight and bias, a convolution's)
_AUTOCAST_PARAM_OPS = ("aten::linear", "aten::convolution")


def _autocast_casts(trace: Trace, ctx: Context) -> tuple[float, int] | None:
    """What BF16 autocast adds that the prediction does not count, at least: (linear and
    convolution calls a step, casts a step). Each call's weight, and its bias where the shapes
    show one, is cast to BF16 in the forward and its gradient back to FP32 in the backward; an
    FP32 activation going into one is cast too, on top (Hugging Face's BERT-base under the
    Trainer: 74 linears a step, 296 casts at least; its bf16 trace held 425 more than its TF32
    one, and the step, host-bound, ran 4.57 ms slower). None without steps or such calls."""
    n = steps_in_window(ctx)
    cpu = trace.cpu
    if not n or cpu.height == 0:
        return None
    dims = pl.col("input_dims").cast(pl.String) if "input_dims" in cpu.columns else pl.lit(None, pl.String)
    # (input, weight, bias: a bias shows as a third input's dims, "[]" where there is none)
    biased = (dims.str.count_matches(r"\],\[") >= 2) & ~dims.str.ends_with(",[]]")
    got = (cpu.lazy().filter(pl.col("name").is_in(_AUTOCAST_PARAM_OPS))
           .select(pl.len().alias("calls"), biased.fill_null(False).sum().alias("biased")).collect())  # fmt: skip
    calls, params = int(got["calls"][0]), int(got["calls"][0]) + int(got["biased"][0])
    return (calls / n, round(2 * params / n)) if calls else None


def _kernels_matching(ctx: Context, pattern: str) -> pl.DataFrame:
    """``ctx.kernel_time_by_name``'s rows whose names match ``pattern`` (Python's ``re``: the
    patterns look ahead, which polars' regex does not)."""
    by_name = ctx.kernel_time_by_name
    hit = [bool(re.search(pattern, n)) for n in by_name["name"].to_list()]
    return by_name.filter(pl.Series(hit, dtype=pl.Boolean)) if hit else by_name.clear()


def _time_of(ctx: Context, pattern: str) -> int:
    """The summed time (ns) of the kernels whose names match ``pattern``."""
    return int(_kernels_matching(ctx, pattern)["dur_ns"].sum())


def _layout_ns(ctx: Context) -> int:
    """cuDNN's NCHW<->NHWC transposes' summed time (ns)."""
    return _time_of(ctx, _LAYOUT_KERNEL)


def tensor_cores_tf32(trace: Trace, ctx: Context) -> list[Finding]:
    """An FP32 model whose matmuls already run on TF32 tensor cores: under BF16 autocast they
    (and FP32 attention) run against the BF16 roof, twice TF32's, and its elementwise kernels
    move half the bytes. What that saves follows each kernel's achieved rate against its roof
    (the per-op model, with shapes); the datasheet ratio alone gives a range that reaches zero
    (a kernel far below its roof gains nothing from a higher one)."""
    if not trace.has_gpu or not ctx.kernel_time_ns or _fp32_gemms_material(ctx):
        # material FP32 SIMT GEMMs: tensor_cores_unused says it first (a few left in FP32, a
        # classifier head where only cuDNN's convolutions default to TF32, do not hold this back)
        return []
    peaks = datasheet_peaks(ctx.device_info.get("name"), ctx.device_info.get("sm_count"))
    if peaks is None or not peaks.tf32_tflops or not peaks.bf16_tflops:
        return []
    # (by name: the kernel rows are freed before the rules run, ``report.assemble``)
    tc = ctx.kernel_time_by_name.filter(pl.col("name").str.contains(_TF32_KERNEL))
    total = ctx.kernel_time_ns or 1
    share = pct(int(tc["dur_ns"].sum()), total)
    if share < _MIN_TF32_SHARE_PCT or not ctx.whatif.available:
        return []
    rest_ns = _time_of(ctx, _FP32_REST_KERNEL)
    attention_ns = _time_of(ctx, _FP32_ATTENTION_KERNEL)
    ratio = peaks.tf32_tflops / peaks.bf16_tflops
    roofs = _roof_factors(ctx, peaks)
    if roofs is not None:
        (t0, t_mid, t1), (r0, r_mid, r1) = roofs["tf32"], roofs["rest"]
        tf32, attention, rest, mid = (t0, t1), (t0, t1), (r0, r1), (t_mid, t_mid, r_mid)
        how = (f"from each operator's achieved rate against its roof (the per-op model): TF32 matmuls and FP32 attention "
               f"take {t0:.2f}-{t1:.2f}x their time in BF16 ({t_mid:.2f}x by their share of the roof), the other "
               f"kernels {r0:.2f}-{r1:.2f}x ({r_mid:.2f}x)")
    else:
        # the ratio alone: from nothing gained (kernels far below their roof) to the ratio of the roofs
        tf32, attention, rest = (ratio, 1.0), (ratio / _FAST_F32_PASSES, 1.0), BF16_ELEMENTWISE_FACTOR
        mid = tuple((x[0] + x[1]) / 2 for x in (tf32, attention, rest))
        flash = (f", {attention[0]:.2f}x for FP32 memory-efficient attention (3xTF32) becoming flash attention"
                 if attention_ns else "")
        how = (f"from the datasheet ratio alone ({ratio:.2f}x for TF32 matmuls{flash}, {rest[0]:g}x for the rest at most, "
               "but for the operators autocast keeps in FP32), which reaches zero: the trace records no shapes, so "
               "each kernel's achieved rate against its roof is unknown (record with record_shapes=True for a per-op "
               "prediction); the middle of that range is replayed")
    names = tc.group_by("name").agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True).head(5)["name"].to_list()
    casts = _autocast_casts(trace, ctx)
    uncounted = (f"; autocast's own casts are replayed as host work: {casts[1]} a step (the weights and biases of "
                 f"{casts[0]:g} linear and convolution calls a step, to BF16 in the forward and their gradients back "
                 "in the backward), each dispatched at the host cost of the step's median launch; not counted: their "
                 "kernels, and the casts of FP32 activations, on top" if casts else "")  # fmt: skip
    # a convolutional model in NCHW: the fix people make is autocast and channels_last together
    # (cuDNN's BF16 convolutions want NHWC no less than its TF32 ones); its transposes go with it
    layout_ns = _layout_ns(ctx)
    conv = (Fix("speed_ops", _LAYOUT_KERNEL, factor=0.0, label="channels_last: no layout transposes"),) if layout_ns else ()

    # the casts' host dispatch, shared among the TF32 matmuls' launches: the casts a step over the
    # matmul kernels a step (both counted over the whole trace)
    gemms = int(_kernels_matching(ctx, _TF32_MATMUL_KERNEL)["count"].sum())
    cast = (Fix("add_casts", _TF32_MATMUL_KERNEL, factor=casts[1] * steps_in_window(ctx) / gemms,
                label="bf16 autocast: its casts"),) if casts and gemms else ()  # fmt: skip

    def fixes(a: float, att: float, b: float) -> tuple[Fix, ...]:
        flash = (Fix("speed_ops", _FP32_ATTENTION_KERNEL, factor=att, label="bf16 autocast: flash attention"),
                 ) if attention_ns else ()  # fmt: skip
        return (*cast, Fix("speed_ops", _TF32_MATMUL_KERNEL, factor=a, label="bf16 autocast: matmuls"), *flash,
                Fix("speed_ops", _FP32_REST_KERNEL, factor=b, label="bf16 autocast: the FP32 rest"), *conv)  # fmt: skip

    f = predicted(
        gain_finding(
            "tensor_cores_unused",
            0,
            ctx.wall_ns,
            id="tensor_cores_tf32",
            title=(f"FP32 model on TF32 tensor cores: {share}% of kernel time in TF32 matmuls and FP32 attention, "
                   "whose roof BF16 at least doubles"),
            evidence={"tf32_kernel_ms": ms(int(tc["dur_ns"].sum())), "share_of_kernel_time_pct": share, "top_kernels": names,
                      "fp32_rest_kernel_ms": ms(rest_ns), "fp32_attention_kernel_ms": ms(attention_ns),
                      **({"layout_conversion_ms": ms(layout_ns)} if layout_ns else {}),
                      **({"autocast_casts_per_step_at_least": casts[1]} if casts else {}),
                      "datasheet_tf32_tflops": peaks.tf32_tflops, "datasheet_bf16_tflops": peaks.bf16_tflops,
                      "bf16_time_factor": {"tf32_kernels": [round(x, 3) for x in tf32],
                                           "fp32_attention_kernels": [round(x, 3) for x in attention],
                                           "other_kernels": [round(x, 3) for x in rest],
                                           "source": "per-op model" if roofs is not None else "datasheet ratio (no shapes)"}},
            fix=("Run forward and loss under torch.autocast('cuda', dtype=torch.bfloat16) (keep the optimizer in FP32); "
                 "attention then takes the flash kernels." + (
                     " The convolutions run in NCHW, which cuDNN transposes around each of them: put the model and its "
                     "inputs in channels_last as well (model.to(memory_format=torch.channels_last), "
                     "x.to(memory_format=torch.channels_last))." if layout_ns else "")),
            where={"kernels": names},
            assumption=f"the gain is predicted {how}" + ("; in channels_last cuDNN's layout transposes are gone"
                                                         if layout_ns else "") + uncounted,
        ),
        ctx,
        *fixes(*mid),
    )
    w = ctx.whatif
    lo, hi = w.predict(*fixes(tf32[1], attention[1], rest[1])), w.predict(*fixes(tf32[0], attention[0], rest[0]))
    # the range the factors span; the verdict follows its lower end
    rng = [round(min(lo.gain_range_ms[0], f.est_gain_ms), 3), round(max(hi.gain_range_ms[1], f.est_gain_ms), 3)]
    f = dataclasses.replace(f, prediction={**(f.prediction or {}), "predicted_gain_range_ms": rng},
                            severity=severity(min(f.est_gain_pct, lo.gain_pct)))  # fmt: skip
    return keep(f, ctx)


def layout_conversions(trace: Trace, ctx: Context) -> list[Finding]:
    """A convolutional model in NCHW: cuDNN runs its tensor-core convolutions in NHWC and
    transposes their tensors to it and back (``nchwToNhwcKernel``/``nhwcToNchwKernel``), kernels
    that channels_last removes. The gain is those kernels' time, replayed (ms per bare step)."""
    if not trace.has_gpu or not ctx.kernel_time_ns:
        return []
    by_name = ctx.kernel_time_by_name
    lk = by_name.filter(pl.col("name").str.contains(_LAYOUT_KERNEL))
    if lk.height == 0:
        return []
    total = int(lk["dur_ns"].sum())
    names = lk.sort("dur_ns", descending=True).head(5)["name"].to_list()
    f = predicted(
        gain_finding(
            "layout_conversions",
            total,
            ctx.wall_ns,
            title=(f"Memory-format conversions around the convolutions: {ms(total, 2)} ms "
                   f"({pct(total, ctx.kernel_time_ns)}% of kernel time) in cuDNN's NCHW<->NHWC transposes"),
            evidence={"layout_conversion_ms": ms(total), "share_of_kernel_time_pct": pct(total, ctx.kernel_time_ns),
                      "top_kernels": names},
            fix=("Put the model and its inputs in channels_last: model = model.to(memory_format=torch.channels_last), "
                 "and each batch x = x.to(memory_format=torch.channels_last) (or in the DataLoader's collate); cuDNN "
                 "then runs the convolutions on the tensors as they are. Under bf16 autocast the convolutions want "
                 "channels_last all the more."),
            where={"kernels": names},
            assumption="in channels_last the convolutions take NHWC tensors as they are: cuDNN's transposes are gone",
        ),
        ctx,
        Fix("speed_ops", _LAYOUT_KERNEL, factor=0.0, label="channels_last: no layout transposes"),
    )  # fmt: skip
    return keep(f, ctx)
