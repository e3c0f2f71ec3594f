"""The findings' gains together: which fixes save the same time, and what all of them save.

Each finding predicts what its own fix saves (``rules._common.predicted``: the bare step
replayed with the fix). Two fixes overlap when making both saves less than the sum of what
each saves alone: both shorten the same stretch of the critical path. The report names those
pairs on each finding (``overlaps``), and gives the combined gain of every fix made together,
never more than the GPU work left after them allows (``summary.predicted``).
"""

from __future__ import annotations

import dataclasses
from itertools import combinations
from typing import Any

from proflab.model.findings import Finding

__all__ = ["with_overlaps", "combined", "OVERLAP_MIN_MS"]

OVERLAP_MIN_MS = 0.05  # less than this in common (per step) is not an overlap worth naming
_MAX_PAIRS_OF = 6  # pairs among the largest predicted findings only


def _replayed(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.fixes and f.est_gain_ms > 0]


def with_overlaps(findings: list[Finding], whatif) -> list[Finding]:
    """The findings, each naming the others whose fixes save partly the same time."""
    if whatif is None or not whatif.available:
        return findings
    top = sorted(_replayed(findings), key=lambda f: -f.est_gain_ms)[:_MAX_PAIRS_OF]
    pairs: dict[str, list[str]] = {}
    for a, b in combinations(top, 2):
        both = whatif.predict(*a.fixes, *b.fixes)
        if both is not None and a.est_gain_ms + b.est_gain_ms - both.gain_ms > max(OVERLAP_MIN_MS, 0.05 * min(a.est_gain_ms, b.est_gain_ms)):
            pairs.setdefault(a.id, []).append(b.id)
            pairs.setdefault(b.id, []).append(a.id)
    return [dataclasses.replace(f, overlaps=tuple(pairs[f.id])) if f.id in pairs else f for f in findings]


def combined(findings: list[Finding], whatif) -> dict[str, Any] | None:
    """Every replayed fix made together: the bare step before and after, and the gain (ms per
    step), beside the sum of the findings' own gains (what double counting would claim)."""
    fs = _replayed(findings)
    if whatif is None or not whatif.available or not fs:
        return None
    p = whatif.predict(*(fix for f in fs for fix in f.fixes))
    if p is None:
        return None
    return {
        "findings": [f.id for f in fs],
        **p.saving(),
        "predicted_gain_range_ms": [round(x, 3) for x in p.gain_range_ms],
        "sum_of_findings_ms": round(sum(f.est_gain_ms for f in fs), 3),
        "gpu_work_after_ms": round(p.gpu_work_after_ms, 3),
        "calibration": whatif.calibration,
    }
