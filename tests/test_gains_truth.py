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
from gains_truth import JOB_ROWS, ROWS, predict, predict_job  # noqa: E402


# Known misses, said in benchmarks/README.md: each fails strictly, so a fix that makes it hold shows.
KNOWN_MISSES = {
    # torch.compile(mode="reduce-overhead") on eager nanoGPT: the replay captures the launches
    # (1.81 ms) but its model of compile's fusion leaves the GPU work at 7.66 ms a step, where
    # Inductor's code ran 5.38 ms (tests/data/compiled): 4.14 ms measured (issue 55)
    "nanogpt / graphs": "the what-if's fusion model under-predicts Inductor's GPU work saving",
    # bf16 autocast on an FP32 LM on TF32, recorded without shapes: each kernel's achieved rate
    # against its roof is unknown, and the datasheet ratio alone is a range from nothing to the
    # roofs' ratio (0-19.2 ms, which holds the 18.68 ms measured); its middle is replayed
    # (a GPT-2 on TF32 gained 1.2 % from bf16 where the ratio said 33 %, issue 55)
    "amp_lm / bf16": "without shapes a precision change's gain is a range reaching zero, its middle replayed",
}


def _rows():
    return [pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[r.label])) if r.label in KNOWN_MISSES
            else r for r in ROWS]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r.label.replace(" / ", "-"))
def test_the_predicted_gain_meets_the_measured_one(row):
    r = predict(row)
    assert r["within"], r


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.label.replace(" / ", "-"))
def test_without_the_measured_step_a_prediction_is_a_lower_bound_whose_range_holds_the_truth(row):
    """A plain trace, the bare step estimated: the gain must survive the profiler's largest
    plausible cost, so it is a lower bound (never more than the tolerance above the measured
    saving), and where a finding names the fix, its range over that cost reaches the
    measured saving (or the bound is already within the tolerance)."""
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
