"""Precision and memory-format fixes of FP32 vision and language models, told from the trace.

The torchvision ResNet-50 (``tests/data/thirdparty/tv_resnet.workers``, recorded by ``proflab
run`` on an H100; its truth in ``truth.json``) runs FP32 with cuDNN's TF32 convolutions and an
FP32 classifier head; the fix people make, bf16 autocast and channels_last, measured 38.17 ->
19.70 ms a step.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

import proflab
from proflab.rules import tensor_cores

THIRD = Path(__file__).parent / "data" / "thirdparty"


def _trace(run: str):
    program = run.split(".")[0]
    return proflab.load(THIRD / run / "traces" / f"{run}.pt.trace.json.xz"), program


@pytest.fixture(scope="module")
def resnet():
    trace, program = _trace("tv_resnet.workers")
    bare = json.loads((THIRD / "truth.json").read_text())["programs"][program]["bare"]
    report = proflab.analyze(trace, bare_step_ms=bare["workers"]["median_ms"])
    kernels = trace.kernels.group_by("name").agg(pl.col("dur_ns").sum(), pl.len().alias("n"))
    measured = bare["workers"]["median_ms"] - bare["amp"]["median_ms"]
    return report, kernels, measured, bare["workers"]["median_ms"], trace.steps.height


def test_cudnn_s_nchw_nhwc_transposes_are_a_finding_whose_fix_is_channels_last(resnet):
    report, kernels, _, _, steps = resnet
    f = {x.id: x for x in report.findings}["layout_conversions"]
    layout = kernels.filter(pl.col("name").str.contains("nchwToNhwc|nhwcToNchw"))
    assert layout["n"].sum() > 1000  # (5 steps: 687 + 346 + 32 + ... transposes)
    assert f.evidence["layout_conversion_ms"] == pytest.approx(layout["dur_ns"].sum() / 1e6, abs=1e-3)
    assert "channels_last" in f.fix
    # replayed: a GPU-bound step saves about those kernels' time a step, and never more
    per_step = layout["dur_ns"].sum() / 1e6 / steps
    assert f.prediction["model"] == "replay" and 0.8 * per_step <= f.est_gain_ms <= per_step
    assert f.severity == "warning"


def test_tf32_convolutions_are_told_and_bf16_with_channels_last_predicts_a_range_holding_the_saving(resnet):
    """cuDNN's TF32 convolutions and CUTLASS's TF32 GEMMs (``tensorop_s1688gemm``) count as TF32
    work; the FP32 SIMT classifier head (0.3 ms of 200) does not hold the finding back; the
    prediction moves the FP32 BN and elementwise kernels and drops the transposes; its range,
    from the ratio alone, reaches the measured saving within 15 % of the step."""
    report, kernels, measured, bare, _ = resnet
    f = {x.id: x for x in report.findings}["tensor_cores_tf32"]
    tf32 = kernels.filter(pl.col("name").str.contains("tf32|tensorop_s1688gemm"))
    assert f.evidence["tf32_kernel_ms"] == pytest.approx(tf32["dur_ns"].sum() / 1e6, abs=1e-3)
    assert any("s1688gemm" in n for n in f.evidence["top_kernels"])
    assert f.evidence["layout_conversion_ms"] > 20 and "channels_last" in f.fix
    assert [x.label for x in f.fixes][-1].startswith("channels_last")
    lo, hi = f.prediction["predicted_gain_range_ms"]
    assert 0 < lo < f.est_gain_ms < hi
    assert lo <= measured <= hi + 0.15 * bare
    assert f.severity == proflab.rules._common.severity(100 * lo / bare)


def test_bf16_leaves_the_optimizer_s_kernels_and_16_bit_kernels_as_they_are():
    """The rest autocast moves is the kernels with FP32 data in their names, not the optimizer's
    (its parameters and state stay FP32) nor kernels already 16-bit."""
    trace, _ = _trace("hf_gpt2.tf32")
    names = trace.kernels["name"].unique().to_list()
    moved = [n for n in names if re.search(tensor_cores._FP32_REST_KERNEL, n)]
    assert moved and not any("multi_tensor_apply" in n for n in moved)
    assert any("multi_tensor_apply" in n for n in names)
    assert not any(re.search(tensor_cores._FP32_REST_KERNEL, n) for n in (
        "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)"
        "::{lambda(float)#1}, std::array<char*, 2ul> >(int, float, std::array<char*, 2ul>)",
        "void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1>(float)"))
    assert not re.search(tensor_cores._TF32_KERNEL, "cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1")



def test_operators_autocast_keeps_in_fp32_are_not_among_the_rest_it_moves():
    """PyTorch's autocast runs softmax, layer norm, the losses, pow, exp, log and rsqrt in FP32
    whatever their inputs: their kernels (forward and backward) are not in the rest whose bytes
    BF16 halves; the elementwise kernels between the matmuls are. On GPT-2 under bf16 (the
    recording after the fix) the kept ones moved as many bytes as before."""
    trace, _ = _trace("hf_gpt2.tf32")
    names = trace.kernels["name"].unique().to_list()
    kept = [n for n in names if re.search(tensor_cores._AUTOCAST_FP32_KERNEL, n)]
    for part in ("SoftMaxForward", "SoftMaxBackward", "layer_norm", "GammaBeta", "pow_tensor_scalar"):
        assert any(part in n for n in kept), part
    assert not any(re.search(tensor_cores._FP32_REST_KERNEL, n) for n in kept)
    assert any(re.search(tensor_cores._FP32_REST_KERNEL, n) for n in names if "CUDAFunctor_add<float>" in n)
    after, _ = _trace("hf_gpt2.bf16")
    per_step = lambda t, pattern: (t.kernels.filter(pl.col("name").str.contains(pattern))["dur_ns"].sum()  # noqa: E731
                                   / t.steps.height)  # fmt: skip
    for pattern in ("cunn_SoftMax", "layer_norm", "pow_tensor_scalar"):
        assert per_step(after, pattern) == pytest.approx(per_step(trace, pattern), rel=0.1), pattern
    ops = ["aten::_softmax", "aten::_log_softmax_backward_data", "aten::native_layer_norm", "aten::pow", "aten::rsqrt",
           "aten::nll_loss_forward"]  # fmt: skip
    assert all(re.search(tensor_cores._AUTOCAST_FP32_OP, o) for o in ops)
    assert not any(re.search(tensor_cores._AUTOCAST_FP32_OP, o) for o in ("aten::add", "aten::mul", "aten::gelu", "aten::logical_not"))


def test_fp32_memory_efficient_attention_becomes_flash_attention_at_a_sixth_of_its_time_at_best():
    """FP32 memory-efficient attention runs 3xTF32 (a third of TF32's roof) and BF16 autocast
    moves it to flash attention at the BF16 roof: its time factor reaches the roofs' ratio over
    three (1/6 on an H100), apart from the TF32 matmuls' (1/2), neither kernel in both fixes. On
    GPT-2, the attention's kernels measured 7.46 -> 1.10 ms a step after the fix (0.15x)."""
    trace, program = _trace("hf_gpt2.tf32")
    bare = json.loads((THIRD / "truth.json").read_text())["programs"][program]["bare"]
    f = {x.id: x for x in proflab.analyze(trace, bare_step_ms=bare["tf32"]["median_ms"]).findings}["tensor_cores_tf32"]
    factors = f.evidence["bf16_time_factor"]
    ratio = f.evidence["datasheet_tf32_tflops"] / f.evidence["datasheet_bf16_tflops"]
    assert factors["fp32_attention_kernels"] == [round(ratio / 3, 3), 1.0]
    assert factors["tf32_kernels"] == [round(ratio, 3), 1.0]
    assert "bf16 autocast: flash attention" in [x.label for x in f.fixes]
    names = trace.kernels["name"].unique().to_list()
    attention = [n for n in names if re.search(tensor_cores._FP32_ATTENTION_KERNEL, n)]
    assert attention and not any(re.search(tensor_cores._TF32_MATMUL_KERNEL, n) for n in attention)
    assert any(re.search(tensor_cores._TF32_MATMUL_KERNEL, n) for n in names)
    after, _ = _trace("hf_gpt2.bf16")
    before_ns = trace.kernels.filter(pl.col("name").str.contains("fmha_cutlass"))["dur_ns"].sum() / trace.steps.height
    flash_ns = after.kernels.filter(pl.col("name").str.contains("sdpa|flash"))["dur_ns"].sum() / after.steps.height
    assert 0.1 < flash_ns / before_ns < 0.5  # past the TF32 matmuls' ratio, as the 3xTF32 roof says


@pytest.fixture(scope="module")
def bert_shapes():
    """BERT-base's TF32 trace, recorded with shapes (``tests/data/thirdparty/shapes``)."""
    return proflab.load(THIRD / "shapes" / "hf_bert.tf32.shapes" / "traces" / "hf_bert.tf32.shapes.pt.trace.json.xz")


def test_the_casts_autocast_adds_are_replayed_as_host_work(bert_shapes):
    """BERT-base under the Trainer, its TF32 step recorded with shapes on a host-bound H100:
    bf16=True made the step 4.57 ms slower there (its bf16 trace held 425 more aten::_to_copy a
    step). The prediction replays the casts autocast adds as host work: each of the 74 linears'
    weight and bias, forward and backward (296 a step); without shapes, the weights only (148).
    The activations' casts are said as not counted."""
    counted = {}
    # (the first set's at its measured step has no finding: the saving's interval holds 0)
    first = proflab.load(THIRD / "hf_bert.tf32" / "traces" / "hf_bert.tf32.pt.trace.json.xz")
    for run, trace, bare in (("hf_bert.tf32.shapes", bert_shapes, 42.91), ("hf_bert.tf32", first, None)):
        f = next(f for f in proflab.analyze(trace, bare_step_ms=bare).findings if f.id == "tensor_cores_tf32")
        counted[run] = f.evidence["autocast_casts_per_step_at_least"]
        assert f"autocast's own casts are replayed as host work: {counted[run]} a step" in f.assumption
        assert "not counted: their kernels, and the casts of FP32 activations" in f.assumption
        assert "bf16 autocast: its casts" in f.prediction["fixes"]
    assert counted == {"hf_bert.tf32.shapes": 296, "hf_bert.tf32": 148}
    bf16 = proflab.load(THIRD / "shapes" / "hf_bert.bf16.shapes" / "traces" / "hf_bert.bf16.shapes.pt.trace.json.xz")
    added = [t.cpu.filter(pl.col("name") == "aten::_to_copy").height / t.steps.height for t in (bf16, bert_shapes)]
    assert added[0] - added[1] >= counted["hf_bert.tf32.shapes"]  # (a lower bound: the FP32 activations come on top)


def test_each_cast_costs_the_host_the_steps_median_launch(bert_shapes):
    """``add_casts`` on BERT's TF32 step: each matmul's launch is preceded by its share of the
    casts, each at the bare plan's median launch (dispatch and call); nothing else moves, and the
    host-bound step replays longer for them."""
    import numpy as np

    from proflab.analysis import Context
    from proflab.analysis.whatif import Fix
    from proflab.analysis.whatif.fixes import apply
    from proflab.analysis.whatif.graph import LAUNCH
    from proflab.analysis.whatif.replay import replay

    w = Context(bert_shapes, bare_step_ms=42.91).whatif
    g, base = w.graph, w.bare_plan()
    fix = Fix("add_casts", tensor_cores._TF32_MATMUL_KERNEL, factor=0.5)
    q = apply(g, base, fix)
    matmuls = np.array([bool(re.search(fix.target, n)) for n in g.op_name]) & (g.op_kind == "kernel")
    calls = g.op_call[matmuls]
    calls = calls[g.call_step[calls] >= 0]
    launch = (base.call_kind == LAUNCH) & (g.call_step >= 0)
    median = float(np.median(base.work[launch] + base.call_dur[launch]))
    assert calls.size > 0 and 1_000 < median < 50_000  # ns: an eager operator's dispatch and launch
    assert q.work.sum() - base.work.sum() == pytest.approx(0.5 * median * calls.size)
    assert np.array_equal(q.work != base.work, np.isin(np.arange(g.n_calls), calls))
    assert q.op_dur.tobytes() == base.op_dur.tobytes() and q.call_dur.tobytes() == base.call_dur.tobytes()
    assert replay(g, q).median_step_ms > replay(g, base).median_step_ms
