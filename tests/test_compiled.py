"""Compiled programs diagnosed as compiled: nanoGPT's GPT recorded under ``proflab run`` on an
H100 eager, compiled and with ``mode="reduce-overhead"`` (tests/data/compiled, made by
tests/data/record/record_compiled.py), and damaged copies of the compiled trace."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

import proflab
from proflab.analysis.context import Context

DATA = Path(__file__).parent / "data" / "compiled"
TRUTH = json.loads((DATA / "compiled.json").read_text())["variants"]


def _trace(variant: str) -> Path:
    (t,) = (DATA / f"nanogpt-{variant}" / "traces").glob("*.pt.trace.json.[gx]z")
    return t


@pytest.fixture(scope="module")
def reports():
    """Each variant's report with the bare step its run measured (as ``proflab analyze RUN`` reads it)."""
    from proflab.readers.rundir import unprofiled_step_ms

    return {v: proflab.analyze(_trace(v), bare_step_ms=unprofiled_step_ms(_trace(v))) for v in ("eager", "compile", "reduce-overhead")}


def test_the_compiled_regions_their_kernels_and_the_eager_rest_are_told_apart():
    c = Context(proflab.load(_trace("compile"))).compiled
    assert c.compiled and not c.graphed
    assert c.regions == 5 and c.frames == {"0": ["0/0"]}  # one compiled frame, called once a step
    assert c.compiled_functions == c.compiled_backward == 5 and c.fx_graph_calls == 10
    assert c.kernels["triton"] > 0 and c.kernels["unlinked"] == 0
    assert c.kernel_ns["in_regions"] > 0.9 * c.kernel_ns["all"]
    # the optimizer, loss and batch copies run eager, outside the regions
    assert c.per_step(c.launches["outside"]) == 13
    assert c.eager_ops[0]["op"] == "aten::_fused_adamw_"
    assert not c.recompiled_frames
    # the host outside every compiled range (the main thread waits in backward() while autograd's
    # thread runs the compiled backward: neither is eager time)
    assert 0 < c.to_dict()["host_outside_ms_per_step"] < 0.5 * 13.961


def test_cuda_graph_replays_are_recognised():
    c = Context(proflab.load(_trace("reduce-overhead"))).compiled
    assert c.compiled and c.graphed
    assert c.per_step(c.launches["graph_replays"]) == 2  # the compiled forward's graph and the backward's
    assert c.kernels["graphed"] > 0.9 * c.kernels["in_regions"]


def test_an_eager_program_has_no_compiled_block(reports):
    assert "compiled" not in reports["eager"].summary
    assert not Context(proflab.load(_trace("eager"))).compiled.compiled


def test_a_launch_bound_compiled_program_is_advised_reduce_overhead_never_compile(reports):
    r = reports["compile"]
    assert r.summary["compiled"]["compiled"]
    (lb,) = [f for f in r.findings if f.category == "launch_bound"]
    top = lb.evidence["breakdown"][0]
    assert top["what"].startswith("the compiled regions' own launches")
    assert "mode='reduce-overhead'" in lb.fix and "fuse them into a few kernels with torch.compile" not in lb.fix
    assert lb.evidence["compiled"]["launches_outside_regions_per_step"] == 13
    # predicted from the bare step proflab run measured, against the step reduce-overhead
    # measured under proflab run: the fix people make, within 15 % of the step
    bare, graphed = TRUTH["compile"]["proflab_bare"]["bare_ms"], TRUTH["reduce-overhead"]["proflab_bare"]["bare_ms"]
    assert lb.prediction["bare_step_source"] == "measured"
    assert abs(lb.est_gain_ms - (bare - graphed)) <= 0.15 * bare


def test_a_program_already_replaying_cuda_graphs_is_not_told_to_capture_them(reports):
    r = reports["reduce-overhead"]
    assert r.summary["compiled"]["graphed"]
    assert not [f for f in r.findings if f.category == "launch_bound"]
    for f in r.findings:
        assert "reduce-overhead" not in f.fix and "torch.compile" not in f.fix


def test_the_regions_fix_removes_only_their_launches():
    from proflab.model.findings import Fix

    ctx = Context(proflab.load(_trace("compile")), bare_step_ms=TRUTH["compile"]["proflab_bare"]["bare_ms"])
    g = ctx.whatif
    regions = g.predict(Fix("cuda_graph", target="regions")).gain_ms
    outside = g.predict(Fix("cuda_graph", target="outside")).gain_ms
    whole = g.predict(Fix("cuda_graph")).gain_ms
    assert 0 < outside < regions <= whole


def test_flops_of_the_compiled_program_equal_the_eager_count_and_nanogpts_formula():
    counted = {v: r["proflab_flops"]["total"] for v, r in TRUTH.items()}
    assert counted["compile"] == counted["eager"] == counted["reduce-overhead"]
    assert all(r["proflab_flops"]["compiled"] is (v != "eager") for v, r in TRUTH.items())
    formula = TRUTH["compile"]["plain"][0]["nanogpt_flops_per_iter"]  # 6N + 12 L H Q T per token
    assert abs(counted["compile"] / formula - 1) < 0.02  # flop_counter counts the head's matmul exactly
    p = proflab.analyze(_trace("compile")).perf
    assert p["per_step"]["model_flops"] == counted["compile"] and p["per_step"]["mfu_pct"] > 0


def test_the_compile_record_of_the_run_is_read(reports):
    rec = reports["compile"].summary["compiled"]["record"]
    assert rec["frames"] == {"total": 1, "ok": 1} and rec["graph_break_count"] == rec["recompile_count"] == 0
    assert not [f for f in reports["compile"].findings if f.category in ("graph_breaks", "recompiles", "cudagraph_skipped")]


def _damaged(tmp_path: Path, change) -> Path:
    doc = json.loads(gzip.decompress(_trace("compile").read_bytes()))
    change(doc["traceEvents"])
    out = tmp_path / "damaged.pt.trace.json.gz"
    out.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return out


def test_a_compiled_trace_without_launch_correlation_says_what_is_missing(tmp_path):
    def drop(events):
        for e in events:
            if e.get("cat") in ("cuda_runtime", "cuda_driver"):
                e.get("args", {}).pop("correlation", None)

    r = proflab.analyze(_damaged(tmp_path, drop))
    assert r.summary["compiled"]["compiled"]
    assert any("no correlation" in m.reason for m in r.missing if m.signal == "compiled regions")


def test_a_compiled_trace_whose_regions_are_unclosed_says_so(tmp_path):
    def unclose(events):
        for e in events:
            if str(e.get("name", "")).startswith(("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFxGraph")):
                e.pop("dur", None)

    r = proflab.analyze(_damaged(tmp_path, unclose))
    c = r.summary.get("compiled") or {}
    # the regions' kernels still say the program is compiled (Inductor's), their split is said missing
    assert c.get("compiled") and c["kernels"]["in_regions"] == 0
    assert any("without an end" in m.reason for m in r.missing if m.signal == "compiled regions")


def test_the_cli_prints_the_compiled_line(tmp_path, capsys):
    from proflab.cli import main

    run = tmp_path / "run"
    shutil.copytree(DATA / "nanogpt-reduce-overhead", run)
    assert main(["analyze", str(run)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Compiled: 5 compiled region calls (0/0)" in out and "CUDA graphs replayed 2 a step" in out


def test_a_program_that_captures_its_own_cuda_graph_is_recognised_as_graphed():
    """torch.cuda.graphs, no torch.compile: the gain-truth set's MLP after its fix."""
    r = proflab.analyze(Path(__file__).parent / "data" / "gains" / "graph_mlp.graph.pt.trace.json.gz")
    c = r.summary["compiled"]
    assert c["graphed"] and not c["compiled"] and c["launches_per_step"]["graph_replays"] == 1
    assert not [f for f in r.findings if f.category == "launch_bound"]


def test_each_hot_kernel_names_the_compiled_region_that_launched_it(reports):
    kernels = reports["compile"].kernels
    regions = {k["compiled_region"] for k in kernels}
    assert {"Torch-Compiled Region: 0/0", "CompiledFunctionBackward"} <= regions
    assert all(k["compiled_region"] for k in kernels if k["name"].startswith("triton_"))
    assert all("compiled_region" not in k for k in reports["eager"].kernels)
