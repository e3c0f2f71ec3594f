"""Where the FLOPs go (analysis.perf): each operator's FLOPs and bytes from the trace, against
the roofline, and MFU, checked against independent counts.

- the gain-truth set's shapes traces (recorded on an H200, tests/data/gains): per step FLOPs
  of GEMMs (tf32_mlp, gpt_char), convolutions (cnn_loader) and attention (gpt_char's SDPA)
  against ``torch.utils.flop_counter``'s count of one step of the same program (truth.json),
  gpt_char's MFU against nanoGPT's formula, and the achieved TFLOPS of the GPT's GEMMs against
  Nsight Compute's durations of the same kernels (gpt_char.ncu.csv.gz);
- programs recorded here on the CPU (convolutions with stride, padding, dilation and groups,
  transposed ones, batched and broadcast matrix products, fused attention, checkpointing)
  against ``flop_counter`` run over the same step;
- the formulas on inline inputs.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from pathlib import Path

import polars as pl
import pytest

import proflab
from proflab.analysis.context import Context
from proflab.analysis.perf import causal_fraction, cost, counted_from, perf_for
from committed import committed

GAINS = Path(__file__).parent / "data" / "gains"
TRUTH = json.loads((GAINS / "truth.json").read_text())


@pytest.fixture(scope="module")
def perfs():
    return {name: perf_for(Context(proflab.load(committed(GAINS, f"{name}.base.shapes"))))
            for name in ("gpt_char", "cnn_loader", "tf32_mlp")}


def _per_step(p, classes: tuple[str, ...]) -> float:
    """Model FLOPs of these classes per step (the trace holds its steps' worth)."""
    c = {r["cls"]: r["flops"] for r in p.classes().iter_rows(named=True)}
    return sum(c.get(k) or 0 for k in classes) / p.steps.height


def _truth(name: str, ops: tuple[str, ...]) -> int:
    by = TRUTH["programs"][name]["flops"]["by_op"]
    return sum(v for k, v in by.items() if k in ops)


# -- against torch.utils.flop_counter on the H200 traces --------------------------------------

def test_gemm_flops_per_step_against_flop_counter(perfs):
    for name in ("tf32_mlp", "gpt_char"):
        assert _per_step(perfs[name], ("gemm",)) == pytest.approx(_truth(name, ("aten.mm", "aten.addmm")), rel=0.02)
    # (the shapes give them exactly: the same multiplies, counted the same way)
    assert _per_step(perfs["tf32_mlp"], ("gemm",)) == TRUTH["programs"]["tf32_mlp"]["flops"]["total"]


def test_conv_flops_per_step_against_flop_counter(perfs):
    """The CNN's three convolutions (stride 1, padding 1, from the recorded concrete inputs),
    forward and backward; the first layer's input needs no gradient (output_mask)."""
    got = _per_step(perfs["cnn_loader"], ("conv",))
    assert got == pytest.approx(_truth("cnn_loader", ("aten.convolution", "aten.convolution_backward")), rel=0.02)
    assert got == _truth("cnn_loader", ("aten.convolution", "aten.convolution_backward"))


def test_attention_flops_per_step_against_flop_counter(perfs):
    """The GPT's causal SDPA (cuDNN), forward and backward: model FLOPs dense, as flop_counter
    counts them; executed FLOPs the unmasked share (256 x 257 / 2 of 256^2 pairs)."""
    p = perfs["gpt_char"]
    truth = _truth("gpt_char", ("aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_cudnn_attention_backward"))
    assert _per_step(p, ("attention",)) == pytest.approx(truth, rel=0.02)
    att = p.classes().filter(pl.col("cls") == "attention").row(0, named=True)
    assert att["exec_flops"] / att["flops"] == pytest.approx(causal_fraction(256, 256), rel=1e-6)


def test_whole_step_against_flop_counter(perfs):
    """Every modelled class together: flop_counter counts only matrix products, convolutions
    and attention; the element-wise, normalisation and reduction FLOPs add 0.2-1.1 %."""
    for name, p in perfs.items():
        per = p.steps.get_column("model_flops")
        assert per.n_unique() == 1  # every step the same program
        assert per[0] == pytest.approx(TRUTH["programs"][name]["flops"]["total"], rel=0.02)
        assert per[0] >= TRUTH["programs"][name]["flops"]["total"]


def test_gpt_mfu_against_the_scripts_formula(perfs):
    """nanoGPT's estimate_mfu (6N + 12·L·H·Q·T per token) against the model FLOPs from the
    trace, over the same unprofiled step time (the median measured bare) and the same peak
    (BF16 dense, the H200's datasheet): within 10 %."""
    p = perfs["gpt_char"]
    bare_ms = TRUTH["programs"]["gpt_char"]["bare"]["base"]["median_ms"]
    formula = TRUTH["programs"]["gpt_char"]["flops"]["script_formula_per_iter"]
    d = p.to_dict()["per_step"]
    assert d["mfu_peak"]["dtype"] == "bf16" and d["mfu_peak"]["tflops"] == 989
    ours = d["model_flops"] / (bare_ms / 1e3) / 989e12
    script = formula / (bare_ms / 1e3) / 989e12
    assert ours == pytest.approx(script, rel=0.10)
    assert abs(ours / script - 1) < 0.02  # (1.6 %: the formula leaves out the element-wise work and the head's bias)
    # the trace's own MFU is over its profiled steps, longer than the bare one
    assert d["mfu_pct"] == pytest.approx(100 * d["model_flops"] / (d["step_ms"] / 1e3) / 989e12, rel=0.05)
    assert d["mfu_pct"] < 100 * ours
    # HFU counts the causal attention's executed half
    assert d["hfu_pct"] < d["mfu_pct"]


def _ncu_rows() -> list[dict]:
    text = gzip.decompress((GAINS / "gpt_char.ncu.csv.gz").read_bytes()).decode()
    lines = [ln for ln in text.splitlines() if not ln.startswith("==")]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    return [r for r in rows[1:] if r.get("ID")]  # (the row after the header: units)


def test_gemm_achieved_tflops_against_nsight_compute():
    """The GPT's GEMM kernels ncu measured (30 consecutive launches of its GEMM and attention
    kernels, launch-skip 200, the program run unprofiled): found in the trace's own sequence
    of those kernels (the same names and grids in the same order; the step repeats per layer,
    so at several places), each kernel's FLOPs from the shapes of the operator that launched
    it, over the trace's durations of the kernel there (median) and over ncu's
    ``gpu__time_duration``: within 10 %. (A split-K GEMM's reduction kernel is another
    kernel: its operator's FLOPs are over its GEMM kernel alone, in both.)"""
    from proflab.analysis.perf.table import operator_table

    tr = proflab.load(GAINS / "gpt_char.base.shapes.pt.trace.json.xz")
    ctx = Context(tr)
    calls = operator_table(tr, ctx.launches).ops.filter(pl.col("cls") == "gemm")
    k = (tr.kernels.join(ctx.launches.select("correlation", "tid", "launch_start_ns"), on="correlation")
         .filter(pl.col("name").str.contains(r"^nvjet|sdpa")).sort("start_ns")
         .with_columns(pl.format("({}, {}, {})", "grid_x", "grid_y", "grid_z").alias("grid")))  # fmt: skip
    k = (k.with_row_index("_i").sort("launch_start_ns")
         .join_asof(calls.select("tid", "start_ns", "end_ns", "exec_flops").sort("start_ns"), left_on="launch_start_ns",
                    right_on="start_ns", by="tid", check_sortedness=False)
         .with_columns(pl.when(pl.col("launch_start_ns") < pl.col("end_ns")).then(pl.col("exec_flops")).alias("exec_flops"))
         .sort("_i"))  # fmt: skip
    ncu = _ncu_rows()
    seq = [(r["Kernel Name"], r["Grid Size"]) for r in ncu]
    trace = list(zip(k["name"].to_list(), k["grid"].to_list()))
    at = [i for i in range(len(trace) - len(seq) + 1) if trace[i:i + len(seq)] == seq]
    assert len(at) >= 4  # (the backward of one layer after another, in each of the 4 steps)
    flops, durs = k["exec_flops"].to_list(), k["dur_ns"].to_list()
    compared = []
    for n, r in enumerate(ncu):
        if not r["Kernel Name"].startswith("nvjet"):
            continue  # (the attention backward ncu measured too: not a GEMM)
        (f,) = {flops[i + n] for i in at}  # the same problem at every place
        trace_ns = sorted(durs[i + n] for i in at)[len(at) // 2]
        ncu_ns = float(r["gpu__time_duration.sum"].replace(",", ""))
        compared.append((f / trace_ns / 1e3, f / ncu_ns / 1e3))
    assert len(compared) == 27
    for trace_tflops, ncu_tflops in compared:
        assert trace_tflops == pytest.approx(ncu_tflops, rel=0.10)
    assert max(t for t, _ in compared) > 500  # the large ones near half the BF16 peak


# -- the report's section ---------------------------------------------------------------------

def test_report_section_ranks_where_a_better_kernel_pays(perfs):
    d = perfs["cnn_loader"].to_dict()
    assert d["flop_source"].startswith("shapes") and d["peaks"]["device"] == "H200 SXM"
    assert d["coverage"]["modelled_pct"] == 100.0
    classes = {c["class"]: c for c in d["classes"]}
    conv = classes["conv"]
    assert conv["bound"] == "compute" and conv["roof"] == "BF16 tensor 989 TFLOPS" and conv["roof_unit"] == "TFLOPS"
    assert conv["achieved_tflops"] == pytest.approx(conv["exec_flops"] / conv["time_ms"] / 1e9, rel=1e-3)
    assert conv["lost_ms"] == pytest.approx(conv["time_ms"] - conv["ideal_ms"], abs=0.002)
    bn = classes["norm"]
    assert bn["bound"] == "memory" and bn["roof"] == "HBM 4800 GB/s" and bn["roof_value"] == 4800
    lost = [o["lost_ms"] for o in d["top_ops"]]
    assert lost == sorted(lost, reverse=True) and d["top_ops"][0]["signature"].startswith("aten::")
    # TF32 off: the fp32 GEMMs are held to the CUDA cores' peak, not the tensor cores'
    g = {c["class"]: c for c in perfs["tf32_mlp"].to_dict()["classes"]}["gemm"]
    assert g["roof"] == "FP32 67 TFLOPS (no tensor cores)" and 40 < g["achieved_tflops"] < 67
    assert perfs["tf32_mlp"].mfu_dtype == "fp32"


def test_optimizer_bytes_from_the_parameters(perfs):
    """The GPT's fused AdamW: its tensor lists carry no shapes; its bytes per step are the
    parameters' (10.7 M fp32, the tied embedding once) times 7 tensors read or written."""
    d, L = 384, 6
    params = 65 * d + 256 * d + L * (4 * d + d * 3 * d + 3 * d + d * d + d + d * 4 * d + 4 * d + 4 * d * d + d) + 2 * d
    opt = perfs["gpt_char"].ops.filter(pl.col("cls") == "optimizer")
    assert opt["count"].sum() == 4 and (opt["bytes"] == 7 * 4 * params).all()


def test_unmodelled_time_is_listed_with_its_share(perfs):
    d = perfs["gpt_char"].to_dict()
    (cat,) = [u for u in d["unmodelled"] if u["op"] == "aten::cat"]
    assert cat["reason"] == "tensor-list inputs carry no shapes" and cat["share_pct"] > 1
    c = d["coverage"]
    assert c["modelled_ms"] + c["unmodelled_ms"] == pytest.approx(c["kernel_ms"], abs=0.002)


def test_a_trace_without_shapes_times_the_classes_and_says_the_flops_are_missing():
    r = proflab.analyze(GAINS / "gpt_char.base.pt.trace.json.gz")
    d = r.to_dict()["perf"]
    assert d["flop_source"] is None and d["per_step"]["mfu_pct"] is None
    assert any(m.startswith("FLOPs: the trace has no input shapes") for m in d["missing"])
    gemm = {c["class"]: c for c in d["classes"]}["gemm"]
    assert gemm["time_ms"] > 5 and gemm["flops"] is None and gemm["achieved_tflops"] is None
    assert any(m["signal"] == "input shapes" for m in r.to_dict()["missing"])


def test_counted_flops_give_mfu_to_a_trace_without_shapes():
    """The FLOPs ``proflab run`` counts for an unprofiled step (SIMULATED here: flop_counter's
    count of the GPT's step from truth.json, as processes/<pid>.json would hold it)."""
    f = TRUTH["programs"]["gpt_char"]["flops"]
    counted = counted_from({"source": "torch.utils.flop_counter, one unprofiled step", "total": f["total"],
                            "by_op": f["by_op"], "by_dtype": {"torch.bfloat16": f["total"]}, "matmul_tf32": False})
    p = perf_for(Context(proflab.load(GAINS / "gpt_char.base.pt.trace.json.gz")), counted=counted)
    d = p.to_dict()
    assert d["flop_source"].startswith("torch.utils.flop_counter") and not d["missing"]
    ps = d["per_step"]
    assert ps["model_flops"] == f["total"] and ps["mfu_peak"]["dtype"] == "bf16"
    assert ps["mfu_pct"] == pytest.approx(100 * f["total"] / (ps["step_ms"] / 1e3) / 989e12, rel=0.01)
    gemm = {c["class"]: c for c in d["classes"]}["gemm"]
    assert gemm["flops"] == 4 * (f["by_op"]["aten.mm"] + f["by_op"]["aten.addmm"])
    assert gemm["achieved_tflops"] == pytest.approx(gemm["flops"] / gemm["time_ms"] / 1e9, rel=1e-3)


def test_parts_combine_to_the_whole():
    from proflab.readers import budget as limits
    from proflab.readers import kineto

    path = GAINS / "cnn_loader.base.shapes.pt.trace.json.gz"
    whole_t = kineto.read(path)
    budget = int(limits.KINETO_PART_FIXED + 0.4 * limits.KINETO_PART_EVENT * (whole_t.gpu.height + whole_t.cpu.height) / limits.KINETO_PART_MARGIN)
    whole = proflab.analyze(path, cache=False).perf
    parts = proflab.analyze(path, all_parts=True, memory_budget=budget, cache=False)
    assert parts.source["inputs"][0]["parts"] > 1
    assert parts.perf["classes"] == whole["classes"] and parts.perf["top_ops"] == whole["top_ops"]
    # (the unprofiled step is the observer's estimate, which parts give within a few %)
    same = ("steps", "model_flops", "exec_flops", "step_ms", "mfu_pct", "hfu_pct", "mfu_peak", "rows")
    assert {k: parts.perf["per_step"][k] for k in same} == {k: whole["per_step"][k] for k in same}
    assert parts.perf["coverage"] == whole["coverage"]


# -- the formulas -------------------------------------------------------------------------------

def _c(name, types, dims, concrete=None):
    return cost(name, ",".join(types), json.dumps(dims), None if concrete is None else json.dumps(concrete))


def test_matrix_product_formulas():
    bf = "c10::BFloat16"
    assert _c("aten::mm", [bf, bf], [[64, 32], [32, 16]]).flops == 2 * 64 * 32 * 16
    c = _c("aten::addmm", [bf, bf, bf, "Scalar", "Scalar"], [[16], [64, 32], [32, 16], [], []])
    assert c.flops == 2 * 64 * 32 * 16 and c.bytes == 2 * (16 + 64 * 32 + 32 * 16 + 64 * 16) and c.dtype == "bf16"
    assert _c("aten::baddbmm", [bf] * 3, [[4, 64, 16], [4, 64, 32], [4, 32, 16]]).flops == 2 * 4 * 64 * 32 * 16
    f8 = "c10::Float8_e4m3fn"
    c = _c("aten::_scaled_mm", [f8, f8, "float", "float", "", "", "Scalar", "Scalar"], [[64, 32], [32, 16], [], [], [], [], [], []],
           ["", "", "", "", "", "", "15", "False"])
    assert c.flops == 2 * 64 * 32 * 16 and c.dtype == "fp8" and c.bytes == 64 * 32 + 32 * 16 + 8 + 64 * 16 * 2
    assert _c("aten::mm", [bf, bf], [[64, 32], [31, 16]]) == "[64, 32] @ [31, 16] is not a matrix product"
    assert cost("aten::mm", None, None, None) == "no input shapes recorded (record_shapes off)"
    assert cost("aten::matmul", "float,float", "[[2,3],[3,4]]", None) == "not in the model"  # its mm is


def test_convolution_formulas():
    fl = "float"
    # conv2d N=2, 8 -> 16 channels, 17x17, 3x3, stride 2, padding 1, dilation 2, groups 4: 8x8 out
    t = [fl, fl, fl, "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"]
    c = _c("aten::convolution", t, [[2, 8, 17, 17], [16, 2, 3, 3], [16], [], [], [], [], [], []],
           ["", "", "", "[2, 2]", "[1, 1]", "[2, 2]", "False", "[0, 0]", "4"])
    out = (17 + 2 - 2 * 2 - 1) // 2 + 1
    assert out == 8 and c.flops == 2 * 2 * 16 * 2 * 9 * out * out
    assert c.bytes == 4 * (2 * 8 * 17 * 17 + 16 * 2 * 9 + 16 + 2 * 16 * out * out)
    # transposed: 8 -> 4 channels (groups 2), 9x9 -> 18x18 (stride 2, padding 1, output_padding 1)
    c = _c("aten::convolution", t, [[2, 8, 9, 9], [8, 2, 3, 3], [4], [], [], [], [], [], []],
           ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "True", "[1, 1]", "2"])
    assert c.flops == 2 * 2 * 9 * 9 * 8 * 2 * 9  # each input position meets its filter
    assert c.bytes == 4 * (2 * 8 * 81 + 8 * 2 * 9 + 4 + 2 * 4 * 18 * 18)
    # cuDNN's own operator: padding before stride
    c2 = _c("aten::cudnn_convolution", [fl, fl, "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar", "Scalar"],
            [[2, 8, 17, 17], [16, 2, 3, 3], [], [], [], [], [], [], []], ["", "", "[1, 1]", "[2, 2]", "[2, 2]", "4", "False", "False", "True"])
    assert c2.flops == 2 * 2 * 16 * 2 * 9 * 64
    # backward: once per gradient asked for
    bt = [fl, fl, fl, "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar", "ScalarList"]
    dims = [[2, 16, 8, 8], [2, 8, 17, 17], [16, 2, 3, 3], [], [], [], [], [], [], [], []]
    both = _c("aten::convolution_backward", bt, dims, ["", "", "", "[16]", "[2, 2]", "[1, 1]", "[2, 2]", "False", "[0, 0]", "4", "[True, True, True]"])
    weight = _c("aten::convolution_backward", bt, dims, ["", "", "", "[16]", "[2, 2]", "[1, 1]", "[2, 2]", "False", "[0, 0]", "4", "[False, True, True]"])
    assert both.flops == 2 * weight.flops == 2 * 2 * 2 * 16 * 2 * 9 * 64
    # no concrete inputs (PyTorch before 2.4): no stride, no count
    assert "no concrete inputs" in _c("aten::convolution", t, [[2, 8, 17, 17], [16, 2, 3, 3], [16], [], [], [], [], [], []])


def test_attention_formulas():
    bf = "c10::BFloat16"
    t = [bf, bf, bf, "", "Scalar", "Scalar", "Scalar", "Scalar", ""]
    dims = [[2, 8, 128, 64], [2, 2, 512, 64], [2, 2, 512, 32], [], [], [], [], [], []]  # GQA, s_q != s_k, d_v != d_q
    dense = _c("aten::_scaled_dot_product_cudnn_attention", t, dims, ["", "", "", "", "True", "0.", "False", "False", ""])
    causal = _c("aten::_scaled_dot_product_cudnn_attention", t, dims, ["", "", "", "", "True", "0.", "True", "False", ""])
    assert dense.flops == causal.flops == 2 * 2 * 8 * 128 * 512 * (64 + 32) and dense.exec_flops == dense.flops
    # top-left aligned causal mask: query i sees keys 0..i
    assert causal.exec_flops == round(causal.flops * (128 * 129 / 2) / (128 * 512))
    assert causal_fraction(256, 256) == 257 / 512 and causal_fraction(4, 2) == (1 + 2 + 2 + 2) / 8
    # flash_attn's layout is [b, s, h, d]
    fa = _c("flash_attn::_flash_attn_forward", [bf, bf, bf, "Scalar", "Scalar", "Scalar"],
            [[2, 128, 8, 64], [2, 512, 2, 64], [2, 512, 2, 32], [], [], []], ["", "", "", "0.", "0.125", "False"])
    assert fa.flops == dense.flops
    bwd = _c("aten::_scaled_dot_product_flash_attention_backward", [bf] * 6 + [""] * 9,
             [[2, 8, 128, 32], [2, 8, 128, 64], [2, 2, 512, 64], [2, 2, 512, 32], [2, 8, 128, 32], [2, 8, 128]] + [[]] * 9,
             [""] * 11 + ["False"] + [""] * 3)
    assert bwd.flops == 2 * 2 * 8 * 128 * 512 * (3 * 64 + 2 * 32)


def test_memory_bound_formulas():
    fl, bf = "float", "c10::BFloat16"
    c = _c("aten::add", [fl, fl, "Scalar"], [[64, 1, 32], [16, 1], []])  # broadcast to [64, 16, 32]
    assert c.cls == "elementwise" and c.flops == 64 * 16 * 32 and c.bytes == 4 * (64 * 32 + 16 + 64 * 16 * 32)
    c = _c("aten::sum", [bf, "ScalarList", "Scalar", ""], [[128, 384], [], [], []], ["", "[0]", "False", ""])
    assert c.cls == "reduction" and c.flops == 128 * 384 and c.bytes == 2 * (128 * 384 + 384)
    c = _c("aten::native_layer_norm", [bf, "ScalarList", bf, bf, "Scalar"], [[8, 128, 384], [], [384], [384], []])
    assert c.cls == "norm" and c.bytes == 2 * (2 * 8 * 128 * 384 + 2 * 384)
    c = _c("aten::embedding", [fl, "long int", "Scalar", "Scalar", "Scalar"], [[65, 384], [64, 256], [], [], []])
    assert c.cls == "embedding" and c.flops == 0 and c.bytes == 8 * 64 * 256 + 2 * 4 * 64 * 256 * 384
    c = _c("aten::_to_copy", [fl, "Scalar"], [[1024], []], ["", "15"])  # to bf16
    assert c.cls == "copy" and c.bytes == 1024 * (4 + 2)
    assert _c("aten::cat", ["TensorList", "Scalar"], [[], []], ["", "0"]) == "tensor-list inputs carry no shapes"
    assert cost("aten::nonzero", "float", "[[8]]", None) == "not in the model"


# -- programs recorded here, on the CPU ----------------------------------------------------------

def _record(tmp_path, step, name="t"):
    """One profiled step (record_shapes) of ``step``, and flop_counter's count of another."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule
    from torch.utils.flop_counter import FlopCounterMode

    step()  # warm-up
    path = tmp_path / f"{name}.pt.trace.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=0, warmup=1, active=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(2):  # (Kineto records nothing without a warm-up step)
            step()
            prof.step()
    with FlopCounterMode(display=False) as fc:
        step()
    by_op = {str(k).replace("aten.", "aten::"): v for k, v in fc.get_flop_counts().get("Global", {}).items()}
    return perf_for(Context(proflab.load(path, cache=False))), by_op, torch


def _class_flops(p) -> dict[str, int]:
    return {r["cls"]: r["flops"] for r in p.classes().iter_rows(named=True)}


def test_cpu_convolutions_and_matrix_products_against_flop_counter(tmp_path):
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)
    convs = [nn.Conv2d(8, 16, 3, stride=2, padding=1, dilation=2), nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1),
             nn.Conv1d(4, 6, 5, stride=3, padding=2), nn.Conv3d(2, 4, 3, padding=(1, 0, 1))]
    lin = nn.Linear(32, 24)
    x2, xt = torch.randn(2, 8, 17, 17, requires_grad=True), torch.randn(2, 8, 9, 9, requires_grad=True)
    x1, x3 = torch.randn(3, 4, 40, requires_grad=True), torch.randn(1, 2, 6, 7, 8, requires_grad=True)
    a, b = torch.randn(5, 16, 32, requires_grad=True), torch.randn(5, 32, 8, requires_grad=True)
    c, d = torch.randn(4, 1, 8, 16, requires_grad=True), torch.randn(3, 16, 5, requires_grad=True)
    bias = torch.randn(5, 16, 8, requires_grad=True)
    xl = torch.randn(5, 7, 32, requires_grad=True)

    def step():
        ys = [convs[0](x2), convs[1](xt), convs[2](x1), convs[3](x3), lin(xl),
              torch.bmm(a, b), torch.baddbmm(bias, a, b), torch.matmul(c, d)]
        sum(y.float().square().mean() for y in ys).backward()

    p, by_op, _ = _record(tmp_path, step)
    mine = _class_flops(p)
    theirs_conv = sum(v for k, v in by_op.items() if "conv" in k)
    theirs_gemm = sum(v for k, v in by_op.items() if k in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"))
    assert mine["conv"] == pytest.approx(theirs_conv, rel=0.02) and mine["gemm"] == pytest.approx(theirs_gemm, rel=0.02)
    assert mine["conv"] == theirs_conv and mine["gemm"] == theirs_gemm


def test_cpu_grouped_convolution_backward_counts_the_groups(tmp_path):
    """A depthwise convolution: flop_counter counts its weight gradient as if ungrouped
    (``groups`` times the forward); here it is the forward, as the math does."""
    torch = pytest.importorskip("torch")
    conv = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
    x = torch.randn(2, 16, 12, 12, requires_grad=True)
    p, by_op, _ = _record(tmp_path, lambda: conv(x).sum().backward())
    fwd = 2 * 2 * 16 * 1 * 9 * 144
    assert by_op["aten::convolution"] == fwd and by_op["aten::convolution_backward"] == fwd + 16 * fwd
    assert _class_flops(p)["conv"] == fwd + 2 * fwd


def test_cpu_fused_attention_against_flop_counters_formulas(tmp_path):
    """The CPU's fused attention kernel, which flop_counter has no entry for: against its
    formulas for the cuDNN/flash operators it does count, causal and not."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    F = torch.nn.functional
    q, k, v = (torch.randn(2, 4, 48, 32, requires_grad=True) for _ in range(3))

    def step():
        (F.scaled_dot_product_attention(q, k, v, is_causal=True) + F.scaled_dot_product_attention(q, k, v)).sum().backward()

    p, _, _ = _record(tmp_path, step)
    att = p.classes().filter(pl.col("cls") == "attention").row(0, named=True)
    shape = [2, 4, 48, 32]
    one = sdpa_flop_count(shape, shape, shape) + sdpa_backward_flop_count(shape, shape, shape, shape)
    assert att["count"] == 4 and att["flops"] == 2 * one
    assert att["exec_flops"] == round(one * causal_fraction(48, 48)) + one


def test_cpu_checkpointed_block_is_recomputation_not_model_flops(tmp_path):
    """torch.utils.checkpoint runs the block's forward again in the backward pass: those
    FLOPs are executed (HFU) but not the model's (MFU)."""
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint

    lin = torch.nn.Linear(64, 64)
    x = torch.randn(32, 64, requires_grad=True)

    def step():
        checkpoint(lambda t: torch.relu(lin(t)), x, use_reentrant=False).sum().backward()

    p, by_op, _ = _record(tmp_path, step)
    gemm = p.ops.filter(pl.col("cls") == "gemm")
    fwd = 2 * 32 * 64 * 64
    assert gemm.filter(pl.col("recompute"))["flops"].sum() == fwd  # the block's addmm, run again
    (row,) = p.steps.iter_rows(named=True)
    assert row["exec_flops"] - row["model_flops"] >= fwd
    assert by_op["aten::addmm"] == 2 * fwd  # (flop_counter counts what ran: the forward twice)


# -- the section in every renderer, and the roofline -----------------------------------------------

HOSTILE = "[bold red]x[/] <script>alert(1)</script> a|b `tick`\nINJECTED"


def _hostile_report():
    import dataclasses

    r = proflab.analyze(GAINS / "gpt_char.base.shapes.pt.trace.json.xz")
    p = json.loads(json.dumps(r.perf))
    p["top_ops"][0]["signature"] = HOSTILE
    p["unmodelled"][0]["op"] = HOSTILE
    return dataclasses.replace(r, perf=p)


def test_terminal_and_markdown_show_the_section(capsys):
    from proflab.render import render

    r = _hostile_report()
    text = render([r], "term", width=80)
    assert "Where the FLOPs go" in text and "MFU 5.8%, HFU 5.5% of BF16 989 TFLOPS" in " ".join(text.split())
    assert "gemm" in text and "where a better kernel pays" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "[bold red]x[/]" in text  # literal
    assert not any(line.lstrip().startswith("INJECTED") for line in text.splitlines())  # a name's newline starts no line
    md = render([r], "md")
    assert "## Where the FLOPs go" in md and "| gemm |" in md
    assert "<script>" not in md and "\\[bold red\\]" in md


def test_html_inlines_the_roofline_with_names_escaped():
    from proflab.render.html import render_html

    page = render_html([_hostile_report()])
    assert page.count('aria-label="roofline of the operators"') == 1 and "Where the FLOPs go" in page
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page


def test_analyze_writes_the_roofline_svg(tmp_path):
    import xml.etree.ElementTree as ET

    from proflab.cli import main

    out = tmp_path / "roof.svg"
    assert main(["analyze", str(GAINS / "cnn_loader.base.shapes.pt.trace.json.gz"), "--roofline", str(out), "-f", "json",
                 "-o", str(tmp_path / "r.json")]) == 0
    svg = ET.parse(out).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    texts = [t.text for t in svg.iter(f"{ns}text")]
    assert "HBM 4,800 GB/s" in texts and "BF16 989 TFLOPS" in texts
    assert {"conv", "norm", "gemm"} <= set(texts)  # the classes, labelled
    doc = json.loads((tmp_path / "r.json").read_text())
    points = [c for c in doc["perf"]["classes"] + doc["perf"]["top_ops"] if c["achieved_tflops"] and c["intensity_flop_per_byte"]]
    assert len(list(svg.iter(f"{ns}circle"))) == len(points)
    assert main(["analyze", str(GAINS / "cnn_loader.base.shapes.pt.trace.json.gz"), "--roofline", str(tmp_path / "r.png")]) == 2


def test_analyze_writes_the_roofline_beside_an_html_page(tmp_path):
    """``-o page.html --roofline roof.svg``: the page and the SVG, the same points as the
    roofline written beside a JSON report (the page path used to drop --roofline unsaid)."""
    from proflab.cli import main

    trace = str(GAINS / "cnn_loader.base.shapes.pt.trace.json.gz")
    page, svg, alone = tmp_path / "page.html", tmp_path / "roof.svg", tmp_path / "alone.svg"
    assert main(["analyze", trace, "--roofline", str(svg), "-o", str(page), "--no-cache"]) == 0
    assert "Where the FLOPs go" in page.read_text()
    assert main(["analyze", trace, "--roofline", str(alone), "-f", "json", "-o", str(tmp_path / "r.json"), "--no-cache"]) in (0, 1)
    assert svg.read_text() == alone.read_text()
    again = tmp_path / "again.svg"  # the page of every event, too
    assert main(["analyze", trace, "--all-parts", "--memory-budget", "none", "--roofline", str(again), "-o", str(tmp_path / "p2.html"),
                 "--no-cache"]) == 0
    assert again.read_text() == alone.read_text()


def test_compare_shows_each_class_tflops_before_and_after():
    """The fp32 MLP with its shapes, against itself and against its TF32 fix (recorded without
    shapes: its classes' time is there, their TFLOPS not)."""
    base = GAINS / "tf32_mlp.base.shapes.pt.trace.json.gz"
    same = proflab.compare(base, base).to_dict()["perf"]
    gemm = {r["class"]: r for r in same["classes"]}["gemm"]
    assert gemm["before_tflops"] == gemm["after_tflops"] and 40 < gemm["before_tflops"] < 67 and gemm["tflops_change_pct"] == 0.0
    assert same["mfu_pct"]["before"] == same["mfu_pct"]["after"] > 50
    fixed = proflab.compare(base, GAINS / "tf32_mlp.tf32.pt.trace.json.gz").to_dict()["perf"]
    gemm = {r["class"]: r for r in fixed["classes"]}["gemm"]
    assert gemm["after_tflops"] is None and gemm["after_ms_per_step"] < gemm["before_ms_per_step"] / 5
    assert fixed["mfu_pct"]["after"] is None
