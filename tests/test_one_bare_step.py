"""One bare step in every number of a report (issue 55): where the unprofiled step is
estimated, the header's range holds the bare step every prediction starts from, and never
reads shorter than the step's GPU work."""

from __future__ import annotations

from pathlib import Path

import pytest

import proflab

KINETO = Path(__file__).parent / "data" / "kineto"


@pytest.mark.parametrize("name", ["sync_every_step", "starved_input", "train_loop"])
def test_the_header_range_holds_every_predictions_bare_step(name):
    r = proflab.analyze(KINETO / f"{name}.pt.trace.json.gz")
    o = r.summary["observer"]
    lo, hi = o["unprofiled_step_ms"]
    assert lo >= o["gpu_work_ms"] - 1e-3
    bares = [f.prediction["bare_step_ms"] for f in r.findings if (f.prediction or {}).get("model") == "replay"]
    if isinstance(r.summary.get("predicted"), dict) and "bare_step_ms" in r.summary["predicted"]:
        bares.append(r.summary["predicted"]["bare_step_ms"])
    assert bares, "these traces have replayed predictions"
    for b in bares:
        assert lo - 1e-3 <= b <= hi + 1e-3, (lo, hi, b)


def test_a_sync_bound_steps_estimate_keeps_the_drain_the_replay_sees():
    """Syncing every step, the loop cannot run at its GPU work alone: the range reaches the
    replayed step with its syncs (26.3 ms), which the sync finding's prediction starts from."""
    o = proflab.analyze(KINETO / "sync_every_step.pt.trace.json.gz").summary["observer"]
    assert o["unprofiled_step_ms"][1] > o["gpu_work_ms"] * 1.2
    assert o["replayed_bare_step_ms"]
