"""Matrix-multiply FLOPs from the input shapes torch.profiler records (analysis.deepdive.flops)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl
import pytest

import proflab
from proflab.analysis.deepdive.flops import gemm_flops, op_flops

H100 = Path(__file__).parent / "data" / "runs" / "20261122-074634-h100_cuda_train"


@pytest.mark.parametrize(
    "name,dims,flop",
    [
        ("aten::mm", [[64, 32], [32, 16]], 2 * 64 * 32 * 16),
        ("aten::_scaled_mm", [[64, 32], [32, 16], [], []], 2 * 64 * 32 * 16),
        ("aten::addmm", [[16], [64, 32], [32, 16], [], []], 2 * 64 * 32 * 16),
        ("aten::_addmm_activation", [[16], [64, 32], [32, 16], [], [], []], 2 * 64 * 32 * 16),
        ("aten::bmm", [[4, 64, 32], [4, 32, 16]], 2 * 4 * 64 * 32 * 16),
        ("aten::baddbmm", [[4, 64, 16], [4, 64, 32], [4, 32, 16], [], []], 2 * 4 * 64 * 32 * 16),
        ("aten::mm", [[64, 32], [31, 16]], None),  # inner sizes disagree: not a product these shapes describe
        ("aten::bmm", [[4, 64, 32], [2, 32, 16]], None),
        ("aten::mm", [[64, 32]], None),
        ("aten::matmul", [[64, 32], [32, 16]], None),  # a composite: its aten::mm child is the one counted
    ],
)
def test_op_flops(name, dims, flop):
    assert op_flops(name, dims) == flop


def _trace(tmp_path, ops, *, record_shapes=1):
    """A Kineto trace with one profiler step holding ``ops`` (name, Input Dims)."""
    evs = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1, "ts": 0, "dur": 1000,
            "args": {"External id": 1}}]
    for i, (name, dims) in enumerate(ops):
        args = {"External id": 10 + i, "Input type": ["c10::BFloat16"] * len(dims or [])}
        if dims is not None:
            args["Input Dims"] = dims
        evs.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 10 + 100 * i, "dur": 50, "args": args})
    doc = {"schemaVersion": 1, "record_shapes": record_shapes, "traceEvents": evs}
    p = tmp_path / "t.pt.trace.json"
    p.write_text(json.dumps(doc))
    return proflab.load(p, cache=False)


def test_reader_keeps_gemm_input_dims_and_counts_leaves_only(tmp_path):
    tr = _trace(tmp_path, [("aten::linear", [[8, 64], [32, 64], [32]]), ("aten::addmm", [[32], [8, 64], [64, 32], [], []]),
                           ("aten::matmul", [[8, 32], [32, 16]]), ("aten::mm", [[8, 32], [32, 16]]), ("aten::relu", [[8, 32]])])
    dims = dict(zip(tr.cpu["name"], tr.cpu["input_dims"]))
    assert dims["aten::mm"] == "[[8,32],[32,16]]" and dims["aten::relu"] is None  # only matmul/conv operators keep shapes
    fc = gemm_flops(tr)
    assert fc.flop == 2 * 8 * 64 * 32 + 2 * 8 * 32 * 16 and fc.ops == 2
    assert fc.per_step.to_dicts() == [{"step": 7, "flop": fc.flop}]


def test_no_count_without_shapes_or_with_convolutions(tmp_path):
    assert "record_shapes" in gemm_flops(_trace(tmp_path, [("aten::mm", None)], record_shapes=0)).missing
    assert "no input shapes" in gemm_flops(_trace(tmp_path, [("aten::mm", None)])).missing
    fc = gemm_flops(_trace(tmp_path, [("aten::mm", [[8, 32], [32, 16]]), ("aten::convolution", [[1, 3, 8, 8], [4, 3, 3, 3]])]))
    assert fc.flop is None and "convolutions" in fc.missing
    assert "no matrix-multiply" in gemm_flops(_trace(tmp_path, [("aten::relu", [[8, 32]])])).missing


def test_recorded_mlp_step_flops():
    """The recorded H100 MLP (Linear 2048->4096->2048, batch 256, AdamW): per step 2 forward
    GEMMs and 3 backward ones (the first layer's input needs no gradient)."""
    tr = proflab.load(next((H100 / "traces").glob("*.pt.trace.json.gz")))
    fc = gemm_flops(tr)
    assert fc.per_step.height == 5
    assert set(fc.per_step["flop"].to_list()) == {5 * 2 * 256 * 2048 * 4096}


NCU = Path(__file__).parent / "data" / "ncu"


@pytest.fixture(scope="module")
def ncu_step():
    from proflab.readers.ncu import load as load_ncu

    return load_ncu([NCU / "train_step_raw.csv.gz", NCU / "train_step_details.csv.gz"]), proflab.load(NCU / "train_step.pt.trace.json.gz")


def test_ncu_flops_refused_when_ncu_measured_only_some_kernels(ncu_step):
    from proflab.analysis.deepdive.flops import ncu_flops

    prof, tr = ncu_step
    fc = ncu_flops(prof, tr)
    # ncu profiled a sample of the step's kernels: a count over them would understate the work
    assert fc.flop is None and "ncu counted FLOPs for 11 of the 83 kernels" in fc.missing


def test_ncu_flops_per_launch_summed_per_step(ncu_step):
    """The real training step's timeline kept to the kernels ncu measured (SIMULATED: a
    timeline whose every kernel was profiled), so each launch gets its kernel's ncu count."""
    from proflab.analysis.deepdive.join import _grid, match_kernels
    from proflab.analysis.deepdive.flops import ncu_flops
    from proflab.analysis.deepdive.verdicts import verdicts

    prof, tr = ncu_step
    vs = [v for v in verdicts(prof) if v.roofline is not None and v.roofline.flop]
    rows = tr.kernels.with_columns(
        pl.concat_str([pl.col("grid_x"), pl.col("grid_y"), pl.col("grid_z")], separator="x").alias("grid"),
        pl.concat_str([pl.col("block_x"), pl.col("block_y"), pl.col("block_z")], separator="x").alias("block"),
    ).select("name", "grid", "block", "correlation").to_dicts()
    flop_of = {}
    for v in vs:
        for r in match_kernels(v, rows):
            if (r["grid"], r["block"]) == (_grid(v.grid), _grid(v.block)):
                flop_of.setdefault(r["correlation"], v.roofline.total_flop)
    kept = tr.gpu.filter((pl.col("kind") != "kernel") | pl.col("correlation").is_in(list(flop_of)))
    fc = ncu_flops(prof, dataclasses.replace(tr, gpu=kept))
    assert fc.missing == "" and fc.source.startswith("ncu")
    assert fc.per_step.height == tr.steps.height == 3
    assert fc.flop == pytest.approx(sum(flop_of.values()), rel=1e-6)  # every kept launch lies in a step
    # the bf16 GEMM (nvjet) is the bulk: its tensor ops dominate the count
    gemm = sum(f for c, f in flop_of.items() if f >= 1e9)
    assert gemm / fc.flop > 0.9
