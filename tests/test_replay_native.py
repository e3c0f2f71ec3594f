"""The compiled replay walk (``analysis/whatif/_replay.c``) against the Python walk it stands in
for: the same floats bit for bit, on the recorded traces' graphs under every fix and on random
graphs (streams, dependencies forward and back, operations fused away or prefetched,
fractional durations), and a refusal, before anything is written, of an index out of range."""

from __future__ import annotations

import glob
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import proflab
from proflab.analysis import Context
from proflab.analysis.whatif import Fix, WhatIf
from proflab.analysis.whatif import replay as replay_mod
from proflab.analysis.whatif.fixes import apply
from proflab.analysis.whatif.graph import COPY, FREE, LAUNCH, OTHER, SYNC, StepGraph
from proflab.analysis.whatif.replay import SYNC_OVERHEAD_NS, Plan, replay

pytestmark = pytest.mark.skipif(replay_mod._native is None, reason="the replay walk was not compiled (no C compiler at install)")

DATA = Path(__file__).parent / "data"
_ARRAYS = ("call_start", "op_start", "op_end", "op_ready")


def _both(g: StepGraph, p: Plan, monkeypatch) -> tuple:
    native = replay(g, p)
    with monkeypatch.context() as m:
        m.setattr(replay_mod, "_native", None)
        python = replay(g, p)
    return native, python


def _same(native, python) -> None:
    for name in _ARRAYS:
        a, b = getattr(native, name), getattr(python, name)
        # bit for bit: the same doubles, NaN where an operation did not run
        assert a.tobytes() == b.tobytes(), f"{name} differs at {np.flatnonzero(~((a == b) | (np.isnan(a) & np.isnan(b))))[:5]}"
    assert native.step_ms == python.step_ms


_FIXES = (
    Fix("remove_syncs"), Fix("remove_host_work"), Fix("fuse_optimizer"), Fix("compile"), Fix("cuda_graph"),
    Fix("speed_ops", "gemm|sgemm|elementwise", factor=0.37), Fix("pin_copies", rate_gbps=24.0), Fix("prefetch_copies"),
    Fix("allocator"), Fix("compress_comm", factor=0.5, rate_gbps=900.0), Fix("add_casts", "gemm|sgemm", factor=2.0),
)  # fmt: skip


@pytest.mark.parametrize(
    "path",
    sorted(glob.glob(str(DATA / "gains" / "*.base.pt.trace.json.[gx]z"))) + sorted(glob.glob(str(DATA / "realistic" / "*.light.pt.trace.json.[gx]z"))),
    ids=lambda p: Path(p).name.split(".pt.")[0],
)
def test_a_recorded_trace_replays_the_same_under_every_fix(path, monkeypatch):
    trace = proflab.load(path)
    w = WhatIf.of(trace, Context(trace))
    if not w.available:
        pytest.skip(f"no step graph: {w.why_not}")
    g = w.graph
    plans = [Plan.of(g), w.bare_plan(0.0), w.bare_plan(1.0)] + [apply(g, w.bare_plan(), f) for f in _FIXES]
    for p in plans:
        _same(*_both(g, p, monkeypatch))


@st.composite
def _graphs(draw):
    n = draw(st.integers(1, 40))
    m = draw(st.integers(0, 60))
    kinds = draw(st.lists(st.sampled_from((LAUNCH, SYNC, COPY, FREE, OTHER)), min_size=n, max_size=n))
    ns = st.floats(0, 5e5, allow_nan=False)  # fractional: a fix scales durations
    op_call = np.array(draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m)), dtype=np.int64)
    op_call.sort()  # (operations in launch order, as the graph keeps them)
    deps = draw(st.lists(st.integers(-1, max(m - 1, -1)), min_size=m, max_size=m))
    z = np.zeros(n, dtype=np.int64)
    g = StepGraph(
        device=0, steps=[1, 2, 3], call_start=np.arange(n, dtype=np.int64), call_dur=z, call_kind=np.array(kinds, dtype=np.int8),
        call_name=np.array(["c"] * n, dtype=object), call_step=np.array(draw(st.lists(st.integers(-1, 3), min_size=n, max_size=n))),
        call_optimizer=np.zeros(n, dtype=bool), work=z, work_events=z, work_python=z, work_loader=z, work_quiet=z,
        op_start=np.zeros(m, dtype=np.int64), op_dur=np.zeros(m, dtype=np.int64),
        op_stream=np.array(draw(st.lists(st.sampled_from((7, 13, 21, -2)), min_size=m, max_size=m)), dtype=np.int64),
        op_kind=np.array(["kernel"] * m, dtype=object), op_name=np.array(["k"] * m, dtype=object), op_call=op_call,
        op_dep=np.array(deps, dtype=np.int64), op_pageable=np.zeros(m, dtype=bool), op_bytes=np.zeros(m, dtype=np.int64),
        op_comm=np.zeros(m, dtype=bool), op_copy=np.array([None] * m, dtype=object),
        op_gap=np.array(draw(st.lists(st.integers(0, 50_000), min_size=m, max_size=m)), dtype=np.int64), op_comm_bytes=np.zeros(m, dtype=np.int64),
        latency_ns=draw(st.integers(0, 10_000)), wake_ns=draw(st.integers(0, 10_000)),
    )  # fmt: skip
    p = Plan.of(g)
    p.work = np.array(draw(st.lists(ns, min_size=n, max_size=n)))
    p.call_dur = np.array(draw(st.lists(ns, min_size=n, max_size=n)))
    p.op_dur = np.array(draw(st.lists(ns, min_size=m, max_size=m)))
    p.op_alive = np.array(draw(st.lists(st.booleans(), min_size=m, max_size=m)), dtype=bool)
    p.op_free = np.array(draw(st.lists(st.booleans(), min_size=m, max_size=m)), dtype=bool)
    p.op_not_before = np.array(draw(st.lists(st.sampled_from((0.0, 1e5, 2.5e6)), min_size=m, max_size=m)))
    return g, p


@settings(max_examples=300, deadline=None)
@given(_graphs())
def test_a_random_graph_replays_the_same(gp):
    g, p = gp
    native = replay(g, p)
    saved, replay_mod._native = replay_mod._native, None
    try:
        python = replay(g, p)
    finally:
        replay_mod._native = saved
    _same(native, python)


def _args(n=2, m=2):
    f = lambda k: np.zeros(k)  # noqa: E731
    return [f(n), f(n), np.array([LAUNCH] * n, dtype=np.int8), np.array([0, 1, m], dtype=np.int64)[: n + 1], np.arange(m, dtype=np.int64),
            f(m), np.ones(m, dtype=bool), np.zeros(m, dtype=np.int64), 1, np.full(m, -1, dtype=np.int64), np.zeros(m, dtype=bool),
            f(m), f(m), 1.0, 1.0, float(SYNC_OVERHEAD_NS), (LAUNCH, SYNC, COPY, FREE), f(n), np.full(m, np.nan), np.full(m, np.nan),
            np.full(m, np.nan)]  # fmt: skip


@pytest.mark.parametrize(
    "at, value, says",
    [
        (4, np.array([0, 5], dtype=np.int64), "call_ops"),  # an operation past the end
        (3, np.array([0, 2, 1], dtype=np.int64), "call_ptr"),  # offsets that fall
        (7, np.array([0, 3], dtype=np.int64), "op_stream"),  # a stream past n_streams
        (9, np.array([-1, 2], dtype=np.int64), "op_dep"),  # a dependency past the end
        (9, np.array([-1, -7], dtype=np.int64), "op_dep"),
        (5, np.zeros(3), "op_alive"),  # (m from op_dur: the other operation arrays then disagree)
        (1, np.zeros(2, dtype=np.float32), "call_dur"),  # the wrong width
    ],
)
def test_an_index_out_of_range_is_refused_before_anything_is_written(at, value, says):
    args = _args()
    args[at] = value
    with pytest.raises(ValueError, match=says):
        replay_mod._native.walk(*args)
    assert np.isnan(args[-3]).all() and np.isnan(args[-1]).all()


def test_the_arguments_as_made_walk():
    args = _args()
    replay_mod._native.walk(*args)
    assert args[-3].tolist() == [1.0, 1.0]  # launched at 0, ready a latency later; the second after the first (0 ns)


FUZZ = Path(__file__).parent / "fuzz"


def _walk_fuzzer():
    sys.path.insert(0, str(FUZZ))
    try:
        import fuzz_walk
    finally:
        sys.path.remove(str(FUZZ))
    return fuzz_walk


@pytest.mark.parametrize("path", sorted((FUZZ / "corpus" / "walk").iterdir()) + sorted((FUZZ / "crashers" / "walk").iterdir()),
                         ids=lambda p: p.name[:12])
def test_the_fuzzer_s_seeds_and_crashers_run_clean_on_the_ordinary_build(path):
    """The fuzzer's own check (``tests/fuzz/fuzz_walk.py``: refused before writing, or the
    Python walk's floats) over what it starts from, where no sanitizer build is at hand."""
    _walk_fuzzer().one(path.read_bytes())


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=8, max_size=600))
def test_the_fuzzer_s_check_holds_on_random_input(data):
    _walk_fuzzer().one(data)
