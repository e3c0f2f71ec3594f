"""Gains that hold when the fix is made: each finding's predicted gain on the gain-truth set
(``tests/data/gains``, recorded on an H200 with each fix made for real and its bare saving
measured) against the measured saving, within the target of ``benchmarks/gains_truth.py``:
15 % of the measured bare step (3 points where the saving is small), or inside the measured
saving's own 95 % interval."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gains_truth import GEN_ROWS, JOB_ROWS, ROWS, THIRD_ROWS, predict, predict_gen, predict_job, predict_third  # noqa: E402


# Known misses, said in benchmarks/README.md: each fails strictly, so a fix that makes it hold shows.
KNOWN_MISSES = {
    # bf16 autocast on an FP32 LM on TF32, recorded without shapes: each kernel's achieved rate
    # against its roof is unknown, and the datasheet ratio alone is a range from nothing to the
    # roofs' ratio (0-19.98 ms, the 18.68 ms measured inside it); its middle is replayed
    # (a GPT-2 on TF32 gained 1.2 % from bf16 where the ratio said 33 %, issue 55)
    "amp_lm / bf16": "without shapes a precision change's gain is a range reaching zero, its middle replayed",
    # the fix made there is a manual capture of the whole step, optimizer included; launch_bound's
    # point is what torch.compile(mode="reduce-overhead") captures, the forward and backward
    # (59 of 106 launches a step): 1.25 ms, its range 1.25-1.95 ms holding the 1.90 ms measured
    "graph_mlp / graph": "the point is the forward and backward's capture; the fix measured captured the whole step",
}


def _marked(rows, misses):
    return [pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=misses[r.label])) if r.label in misses else r
            for r in rows]


def _rows():
    return [pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[r.label])) if r.label in KNOWN_MISSES
            else r for r in ROWS]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r.label.replace(" / ", "-"))
def test_the_predicted_gain_meets_the_measured_one(row):
    r = predict(row)
    assert r["within"], r


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.label.replace(" / ", "-"))
def test_without_the_measured_step_a_prediction_is_a_lower_bound_whose_range_holds_the_truth(row):
    """A plain trace, the bare step estimated: the gain is the replay's at the middle of the
    profiler's plausible cost, and a host fix's range reaches down to what survives the largest
    (which the severity follows). On this set the gain never overshoots the measured saving by
    more than the tolerance, and where a finding names the fix, its range over that cost reaches
    the measured saving (or the gain is already within the tolerance)."""
    r = predict(row, measured_bare=False)
    tol = 0.15 * r["bare_ms"]
    assert r["predicted_ms"] <= r["measured_ms"] + tol, r
    if r["predicted_ms"] > 0:
        lo, hi = r["predicted_range_ms"]
        assert r["within"] or lo - tol <= r["measured_ms"] <= hi + tol, r


def test_a_straggler_s_fix_is_predicted_from_the_ranks_replayed_together():
    # rank 1's 30 ms of host work a step: the balanced job (measured) against the ranks'
    # replay with that work removed, collectives in lockstep
    r = predict_job(*JOB_ROWS[0][:3])
    assert r["within"], r


def test_where_the_ranks_cannot_be_replayed_together_the_claim_says_it_is_idle_time():
    """The bf16 hook with larger buckets measured 0.43 ms of 10.60. This job's ranks, replayed
    together, do not give back its step (a collective waits for a GEMM to free the SMs, which
    the replay does not model), so no replay predicts the fix: the finding keeps the exposed
    communication it measured, per step, and says that is what its figure is (a miss of the
    target, reported in benchmarks/README.md)."""
    r = predict_job(*JOB_ROWS[1][:3])
    assert r["finding"] == "communication_bound (idle time)", r


# Programs nobody here wrote (benchmarks/README.md): their misses, each said there.
# Strict, so a model that comes to hold them shows.
THIRD_PARTY_MISSES = {
    "hf_gpt2 / bf16 -> bf16-compile": "GPU-bound bf16 GPT-2: the row reads launch_bound, which needs a launch-bound "
    "step; unfused_elementwise predicts compile's fusion at 8.14 (0.38-15.77) ms against 19.17 measured of 39.59",
    "lightning_lm / high -> bf16": "a trace without shapes: the BF16 gain is the range 0 to the datasheet ratio, "
    "its middle 9.44 ms against 15.88 measured",
    "tv_resnet / workers -> amp": "a trace without shapes: bf16 autocast with channels_last is the cuDNN transposes "
    "gone and a range (4.13-15.94 ms) for the TF32 and FP32-data kernels, its middle 11.96 ms against 18.47 measured "
    "(all of them halved)",
    "generate b1 / nocache -> cache": "the fix made each token 0.31 ms slower (5% of 6.17 ms: the cache's own host "
    "work); nothing is claimed, which is right, but a loss is not predicted",
    # the report half (recorded after the models were set): its misses at first sight
    "hf_bert / tf32 -> bf16": "BERT-base's bf16 saved 1.50 ms of 47.34 (3.2%); with the measured step nothing is "
    "claimed (the replay leaves the launch-bound step as it is), 0.2 points past the 3-point tolerance",
    # the report half's second set (recorded and analysed once, after the per-event cost was measured from traces)
    "hf_llama / tf32 -> bf16": "bf16 saved 4.23 ms of 42.31 (10%); the datasheet ratio's range without shapes (0-13.96 ms) "
    "holds it, its middle (7.16) 6.9 points over, past the 3-point tolerance of a small saving",
    # the third set (TF32 traces with shapes, a second H100 with a slower host): the per-op model's
    # BF16 rates, at first sight with no word of what autocast adds: in BERT's bf16 trace beside it,
    # aten::_to_copy 37 -> 462 a step, host events 8,635 -> 10,390, kernels 739 -> 1,115, while the
    # GPU's work fell 26.62 -> 16.63 ms a step; the weights' casts replayed since (4.79 -> 4.10 ms)
    "hf_bert / tf32 -> bf16 (shapes)": "bf16 made BERT's host-bound step 4.57 ms slower (42.91 -> 47.48 ms); the per-op "
    "model predicts 4.10 ms saved from the kernels' rates less the weights' casts (a loss is not predicted)",
}


@pytest.mark.parametrize("row", _marked(THIRD_ROWS, THIRD_PARTY_MISSES), ids=lambda r: r.label.replace(" / ", "-"))
def test_a_fix_to_a_program_nobody_here_wrote_is_predicted_from_its_run(row):
    r = predict_third(row)
    assert r["within"], r


@pytest.mark.parametrize("row", _marked(GEN_ROWS, THIRD_PARTY_MISSES), ids=lambda r: r.label.replace(" / ", "-"))
def test_a_fix_to_generate_is_predicted_per_token(row):
    r = predict_gen(row)
    assert r["within"], r


def test_where_a_cache_would_not_save_time_none_is_claimed():
    """generate() without a cache on the H100, at batch 8 and 32: use_cache=True saved nothing
    bare (0.02 ms a token either way, within the bootstrap interval of zero; at TinyLlama's shape
    the cache cost 0.08 ms a token at batch 8): no recompute gain may be claimed."""
    for row in GEN_ROWS:
        if row.finding == "kv_cache_recompute" and row.batch in (8, 32):
            r = predict_gen(row)
            lo, hi = r["measured_ci95_ms"]
            assert r["finding"] == "no finding" and lo < 0.1 and abs(r["measured_ms"]) < 0.03 * r["bare_ms"], r
