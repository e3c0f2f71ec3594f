"""IntervalSet: golden cases, then properties checked against a brute-force set of integers.

Every span is half-open ``[start, end)``, so on integer time the set of covered instants is
``set(range(start, end))`` and the brute-force reference is plain set arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proflab.analysis.timeline.intervals import IntervalSet


def spans(s: IntervalSet) -> list[tuple[int, int]]:
    return list(zip(s.starts.tolist(), s.ends.tolist()))


def make(*pairs: tuple[int, int]) -> IntervalSet:
    return IntervalSet.from_spans([a for a, _ in pairs], [b for _, b in pairs])


def gap_spans(g: tuple[np.ndarray, np.ndarray]) -> list[tuple[int, int]]:
    return list(zip(g[0].tolist(), g[1].tolist()))


# -- golden cases ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        pytest.param([(0, 10), (5, 15)], [(0, 15)], id="overlap"),
        pytest.param([(0, 5), (5, 10)], [(0, 10)], id="touching-merge"),
        pytest.param([(0, 5), (6, 10)], [(0, 5), (6, 10)], id="one-apart-stay-apart"),
        pytest.param([(0, 100), (10, 20), (30, 40)], [(0, 100)], id="nested"),
        pytest.param([(10, 20), (0, 100)], [(0, 100)], id="nested-outer-second"),
        pytest.param([(30, 40), (0, 10), (20, 25)], [(0, 10), (20, 25), (30, 40)], id="unsorted"),
        pytest.param([(0, 10), (2, 3), (9, 12), (12, 14)], [(0, 14)], id="chain"),
        pytest.param([(5, 5)], [], id="zero-length-vanishes"),
        pytest.param([(0, 0), (3, 7), (7, 7)], [(3, 7)], id="zero-length-among-real"),
        pytest.param([(9, 3)], [], id="reversed-vanishes"),
        pytest.param([(2, 4), (2, 4), (2, 4)], [(2, 4)], id="duplicates"),
        pytest.param([], [], id="empty"),
    ],
)
def test_from_spans_golden(pairs, expected):
    s = make(*pairs)
    assert spans(s) == expected
    assert len(s) == len(expected)
    assert s.total_ns == sum(b - a for a, b in expected)
    assert s.starts.dtype == np.int64 and s.ends.dtype == np.int64


def test_empty_set():
    e = IntervalSet.empty()
    assert len(e) == 0 and e.total_ns == 0
    assert e.covered_within([0, 5], [10, 20]).tolist() == [0, 0]
    assert e.covered_before([-3, 0, 7]).tolist() == [0, 0, 0]
    assert gap_spans(e.gaps()) == []
    assert gap_spans(e.gaps(10, 20)) == [(10, 20)]
    assert gap_spans(e.gaps(20, 10)) == []
    assert gap_spans(e.gaps(10, 10)) == []
    assert spans(e.union(make((1, 2)))) == [(1, 2)]
    assert spans(e.clip(0, 100)) == []


TWO = ((10, 20), (30, 40))


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (0, 10, 0),  # ends where coverage starts (half-open)
        (0, 11, 1),
        (0, 15, 5),
        (15, 35, 10),
        (20, 30, 0),  # exactly the hole
        (0, 100, 20),
        (12, 12, 0),  # empty window
        (40, 10, 0),  # inverted window counts nothing
        (39, 41, 1),
    ],
)
def test_covered_within_golden(a, b, expected):
    s = make(*TWO)
    assert s.covered_within(np.array([a]), np.array([b])).tolist() == [expected]
    # scalars work too and give the same number
    assert int(s.covered_within(a, b)) == expected


def test_covered_before_golden():
    s = make(*TWO)
    assert s.covered_before([0, 10, 15, 20, 25, 30, 35, 40, 99]).tolist() == [0, 0, 5, 10, 10, 10, 15, 20, 20]


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (None, None, [(20, 30)]),
        (0, 50, [(0, 10), (20, 30), (40, 50)]),
        (15, 35, [(20, 30)]),
        (25, 28, [(25, 28)]),  # window inside the hole
        (0, 5, [(0, 5)]),  # window before all coverage
        (45, 50, [(45, 50)]),  # window after all coverage
        (12, 18, []),  # window inside a span
        (10, 40, [(20, 30)]),  # window exactly the hull
        (50, 0, []),  # inverted window
    ],
)
def test_gaps_golden(lo, hi, expected):
    assert gap_spans(make(*TWO).gaps(lo, hi)) == expected


def test_clip_and_union_golden():
    s = make(*TWO)
    assert spans(s.clip(15, 35)) == [(15, 20), (30, 35)]
    assert spans(s.clip(20, 30)) == []
    assert spans(s.union(make((18, 32)))) == [(10, 40)]
    assert spans(s.union(make((20, 30)))) == [(10, 40)]  # fills the hole exactly: touching merges
    assert spans(s.union(make((0, 5)))) == [(0, 5), (10, 20), (30, 40)]


def test_realistic_nanosecond_timestamps():
    # Kineto timestamps are epoch-based: ~1.7e18 ns. Nothing may overflow or lose precision.
    base = 1_790_857_026_000_000_000
    s = make((base + 1, base + 1_001), (base + 500, base + 2_000), (base + 5_000, base + 5_003))
    assert spans(s) == [(base + 1, base + 2_000), (base + 5_000, base + 5_003)]
    assert s.total_ns == 2_002
    assert s.covered_within([base], [base + 10_000]).tolist() == [2_002]
    assert gap_spans(s.gaps(base, base + 6_000)) == [(base, base + 1), (base + 2_000, base + 5_000), (base + 5_003, base + 6_000)]


# -- properties against brute force ------------------------------------------------------------

T = st.integers(min_value=-5, max_value=60)
SPANS = st.lists(st.tuples(T, T), max_size=12)  # includes zero-length and reversed spans
WINDOWS = st.lists(st.tuples(T, T), min_size=1, max_size=8)


def covered(pairs) -> set[int]:
    out: set[int] = set()
    for a, b in pairs:
        out.update(range(a, b))
    return out


def points(pairs) -> set[int]:
    return covered(pairs)


@settings(max_examples=300, deadline=None)
@given(SPANS)
def test_union_total_equals_covered_integers(pairs):
    s = make(*pairs)
    assert s.total_ns == len(covered(pairs))
    assert points(spans(s)) == covered(pairs)


@settings(max_examples=300, deadline=None)
@given(SPANS)
def test_normal_form_sorted_disjoint_nonempty_nontouching(pairs):
    s = make(*pairs)
    got = spans(s)
    assert all(a < b for a, b in got)
    # strictly increasing with a real hole between neighbours (touching spans were merged)
    assert all(prev_end < next_start for (_, prev_end), (next_start, _) in zip(got, got[1:]))


@settings(max_examples=300, deadline=None)
@given(SPANS, WINDOWS)
def test_covered_within_matches_brute_force(pairs, windows):
    s = make(*pairs)
    ref = covered(pairs)
    a = np.array([w[0] for w in windows], dtype=np.int64)
    b = np.array([w[1] for w in windows], dtype=np.int64)
    expected = [len(ref & set(range(lo, hi))) for lo, hi in windows]
    assert s.covered_within(a, b).tolist() == expected


@settings(max_examples=300, deadline=None)
@given(SPANS, st.lists(T, min_size=1, max_size=8))
def test_covered_before_matches_brute_force(pairs, ts):
    s = make(*pairs)
    ref = covered(pairs)
    assert s.covered_before(np.array(ts)).tolist() == [sum(1 for x in ref if x < t) for t in ts]


@settings(max_examples=300, deadline=None)
@given(SPANS, st.lists(T, min_size=1, max_size=8))
def test_contains_matches_brute_force_and_covered_within(pairs, ts):
    s = make(*pairs)
    ref = covered(pairs)
    t = np.array(ts, dtype=np.int64)
    assert s.contains(t).tolist() == [x in ref for x in ts]
    assert s.contains(t).tolist() == (s.covered_within(t, t + 1) > 0).tolist()


def test_contains_of_the_empty_set():
    assert IntervalSet.empty().contains(np.array([0, 5])).tolist() == [False, False]


@settings(max_examples=300, deadline=None)
@given(SPANS, T, T)
def test_gaps_partition_the_window(pairs, lo, hi):
    s = make(*pairs)
    ref = covered(pairs)
    g = gap_spans(s.gaps(lo, hi))
    gap_points = points(g)
    window = set(range(lo, hi))
    # gaps plus covered time add up to the window...
    assert sum(b - a for a, b in g) + int(s.covered_within(lo, hi)) == max(hi - lo, 0)
    # ...because gaps are exactly the uncovered part of the window: disjoint from the set
    assert not (gap_points & ref)
    assert gap_points == window - ref
    # each gap non-empty, sorted, and no two gaps overlap or touch (each hole is one gap)
    assert all(a < b for a, b in g)
    assert all(prev_end < next_start for (_, prev_end), (next_start, _) in zip(g, g[1:]))


@settings(max_examples=300, deadline=None)
@given(SPANS, st.one_of(st.none(), T), st.one_of(st.none(), T))
def test_gaps_with_open_bounds(pairs, lo, hi):
    # An omitted bound defaults to the first (lo) or last (hi) covered instant.
    s = make(*pairs)
    ref = covered(pairs)
    if ref:
        lo_eff = min(ref) if lo is None else lo
        hi_eff = max(ref) + 1 if hi is None else hi
        expected = set(range(lo_eff, hi_eff)) - ref
    elif lo is not None and hi is not None:
        expected = set(range(lo, hi))
    else:
        expected = set()
    assert points(gap_spans(s.gaps(lo, hi))) == expected


@settings(max_examples=200, deadline=None)
@given(SPANS, SPANS, SPANS)
def test_union_commutative_associative_idempotent(p, q, r):
    a, b, c = make(*p), make(*q), make(*r)
    assert spans(a.union(b)) == spans(b.union(a))
    assert spans(a.union(b).union(c)) == spans(a.union(b.union(c)))
    assert spans(a.union(a)) == spans(a)
    assert spans(a.union(IntervalSet.empty())) == spans(a)
    assert points(spans(a.union(b))) == covered(p) | covered(q)


@settings(max_examples=200, deadline=None)
@given(SPANS, T, T)
def test_clip_is_intersection_with_window(pairs, lo, hi):
    s = make(*pairs)
    assert points(spans(s.clip(lo, hi))) == covered(pairs) & set(range(lo, hi))
