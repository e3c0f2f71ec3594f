"""FLOPs as the reader keeps what they are counted from, and of a trace's kernels from Nsight
Compute (analysis.deepdive.flops); the operators' own FLOPs are tests/test_perf.py's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl
import pytest

import proflab
from proflab.analysis.context import Context
from proflab.analysis.perf import perf_for

H100 = Path(__file__).parent / "data" / "runs" / "20261122-074634-h100_cuda_train"


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


def test_reader_keeps_every_operators_shapes_and_the_composites_are_not_counted(tmp_path):
    tr = _trace(tmp_path, [("aten::linear", [[8, 64], [32, 64], [32]]), ("aten::addmm", [[32], [8, 64], [64, 32], [], []]),
                           ("aten::matmul", [[8, 32], [32, 16]]), ("aten::mm", [[8, 32], [32, 16]]), ("aten::relu", [[8, 32]])])
    dims = dict(zip(tr.cpu["name"], tr.cpu["input_dims"]))
    assert dims["aten::mm"] == "[[8,32],[32,16]]" and dims["aten::relu"] == "[[8,32]]"
    p = perf_for(Context(tr))
    got = {r["op"]: r["flops"] for r in p.ops.iter_rows(named=True)}
    # the leaves the composites (linear, matmul) dispatch to are the ones counted
    assert got == {"aten::addmm": 2 * 8 * 64 * 32, "aten::mm": 2 * 8 * 32 * 16, "aten::relu": 8 * 32}
    assert p.steps.select("step", "model_flops").to_dicts() == [{"step": 7, "model_flops": sum(got.values())}]


def test_recorded_mlp_step_flops():
    """The recorded H100 MLP (Linear 2048->4096->2048, batch 256, AdamW): per step 2 forward
    GEMMs and 3 backward ones (the first layer's input needs no gradient)."""
    p = perf_for(Context(proflab.load(next((H100 / "traces").glob("*.pt.trace.json.gz")))))
    assert p.steps.height == 5
    gemm = p.ops.filter(pl.col("cls") == "gemm").group_by("step").agg(pl.col("flops").sum())
    assert set(gemm["flops"].to_list()) == {5 * 2 * 256 * 2048 * 4096}


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
