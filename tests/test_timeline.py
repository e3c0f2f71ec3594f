"""Golden tests for the timeline helpers: low-utilisation stretches."""

from __future__ import annotations

from proflab.analysis.timeline.intervals import IntervalSet
from proflab.analysis.timeline.breakdown import low_stretches

MS = 1_000_000


def test_one_idle_stretch_is_found_with_its_bounds():
    busy = IntervalSet.from_spans([0, 60 * MS], [10 * MS, 100 * MS])
    assert low_stretches(busy, 0, 100 * MS) == [(10 * MS, 60 * MS, 0.0)]


def test_short_dips_are_not_stretches_and_longest_comes_first():
    # idle 30-31 ms (1% of the window: below min_share), 40-50 ms and 70-90 ms
    busy = IntervalSet.from_spans([0, 31 * MS, 50 * MS, 90 * MS], [30 * MS, 40 * MS, 70 * MS, 100 * MS])
    got = low_stretches(busy, 0, 100 * MS)
    assert [(s // MS, e // MS) for s, e, _ in got] == [(70, 90), (40, 50)]


def test_half_busy_buckets_are_not_low():
    starts = [i * MS for i in range(100)]
    busy = IntervalSet.from_spans(starts, [s + MS // 2 for s in starts])  # exactly 50 % everywhere
    assert low_stretches(busy, 0, 100 * MS, threshold_pct=50.0) == []
    assert low_stretches(busy, 0, 100 * MS, threshold_pct=60.0)[0][:2] == (0, 100 * MS)
