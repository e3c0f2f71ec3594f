"""Golden tests for idle-gap attribution: a tiny inline Kineto trace, the gap table expected.

Times below are microseconds as Kineto writes them. Each scenario puts one kind of gap
between two kernels on device 0; the launch calls are on host thread 1.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

import proflab
from proflab.analysis import Context


def _kernel(corr: int, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": f"k{corr}", "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": 7, "correlation": corr, "External id": corr}}  # fmt: skip


def _runtime(name: str, ts: float, dur: float, corr: int | None = None) -> dict:
    args = {"External id": corr or 0} | ({"correlation": corr} if corr else {})
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def _cpu(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}


def _gaps(tmp_path, events: list[dict]) -> pl.DataFrame:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    ctx = Context(proflab.load(path))
    # Only the gaps between GPU work: the window also opens with the host launching the first
    # kernel, an idle edge that is not what these scenarios are about.
    first = ctx.trace.gpu["start_ns"].min()
    return ctx.gaps.filter(pl.col("start_ns") > first).select("start_ns", "dur_ns", "cause")


BASE = 1_000.0


def test_sync_then_quick_relaunch_is_sync(tmp_path):
    events = [
        _runtime("cudaLaunchKernel", BASE, 5, corr=1), _kernel(1, BASE + 10, 500),
        _runtime("cudaStreamSynchronize", BASE + 20, 492),  # returns 2 us after the GPU drains
        _runtime("cudaLaunchKernel", BASE + 530, 5, corr=2), _kernel(2, BASE + 540, 100),
    ]  # fmt: skip
    gaps = _gaps(tmp_path, events).filter(pl.col("dur_ns") > 0)
    assert gaps.rows() == [(int((BASE + 510) * 1000), 30_000, "sync")]


def test_idle_after_a_sync_returns_is_the_syncs(tmp_path):
    # The gap follows the sync's return, so it is the sync's, even when the host then loads
    # data for 5 ms: without the sync that loading would have overlapped the GPU work. How
    # much of it removing the sync can win back (at most the step's GPU work) is the rules'
    # question; the rest is host-bound (tests/test_verdicts_realistic.py).
    events = [
        _runtime("cudaLaunchKernel", BASE, 5, corr=1), _kernel(1, BASE + 10, 100),
        _runtime("cudaStreamSynchronize", BASE + 20, 92),
        _cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", BASE + 120, 5_000),
        _runtime("cudaLaunchKernel", BASE + 5_130, 5, corr=2), _kernel(2, BASE + 5_140, 100),
    ]  # fmt: skip
    (row,) = _gaps(tmp_path, events).rows()
    assert row[2] == "sync" and row[1] == 5_030_000


def test_short_gaps_between_tiny_kernels_are_launch(tmp_path):
    events = []
    for i in range(1, 6):
        t = BASE + 20 * i
        events += [_runtime("cudaLaunchKernel", t, 8, corr=i), _kernel(i, t + 10, 2)]
    gaps = _gaps(tmp_path, events)
    assert gaps["cause"].to_list() == ["launch"] * 4
    assert gaps["dur_ns"].to_list() == [18_000] * 4


def test_work_queued_before_the_gap_is_dependency(tmp_path):
    events = [
        _runtime("cudaLaunchKernel", BASE, 5, corr=1), _kernel(1, BASE + 10, 100),
        _runtime("cudaLaunchKernel", BASE + 20, 5, corr=2), _kernel(2, BASE + 150, 100),  # waited on the GPU
    ]  # fmt: skip
    assert _gaps(tmp_path, events)["cause"].to_list() == ["dependency"]


def test_work_without_a_launch_event_is_unknown(tmp_path):
    events = [_kernel(1, BASE, 100), _kernel(2, BASE + 300, 100)]
    assert _gaps(tmp_path, events)["cause"].to_list() == ["unknown"]


@pytest.mark.parametrize("copy_name", ["Memcpy DtoH (Device -> Pageable)"])
def test_blocking_pageable_copy_counts_as_sync(tmp_path, copy_name):
    """`.item()` on old PyTorch: a cudaMemcpyAsync into pageable memory blocks the host."""
    copy = {"ph": "X", "cat": "gpu_memcpy", "name": copy_name, "pid": 0, "tid": 7, "ts": BASE + 110, "dur": 3,
            "args": {"device": 0, "stream": 7, "correlation": 2, "bytes": 4}}  # fmt: skip
    events = [
        _runtime("cudaLaunchKernel", BASE, 5, corr=1), _kernel(1, BASE + 10, 100),
        _runtime("cudaMemcpyAsync", BASE + 20, 95, corr=2), copy,
        _runtime("cudaLaunchKernel", BASE + 125, 5, corr=3), _kernel(3, BASE + 135, 100),
    ]  # fmt: skip
    assert _gaps(tmp_path, events)["cause"].to_list() == ["sync"]


def test_synchronous_copy_api_is_reported_without_double_counting(tmp_path):
    copy = {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0, "tid": 7,
            "ts": BASE + 110, "dur": 20, "args": {"device": 0, "stream": 7, "correlation": 2, "bytes": 1 << 20}}  # fmt: skip
    events = [
        _runtime("cudaLaunchKernel", BASE, 5, corr=1), _kernel(1, BASE + 10, 100),
        _runtime("cudaMemcpy", BASE + 20, 112, corr=2), copy,
        _runtime("cudaLaunchKernel", BASE + 140, 5, corr=3), _kernel(3, BASE + 150, 100),
    ]  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    report = proflab.analyze(path)
    found = {f.id: f for f in report.findings}
    api = found["sync_copy_apis"]
    assert api.category == "sync_bound" and api.est_gain_ms == 0
    assert api.evidence["apis"] == [{"api": "cudaMemcpy", "calls": 1, "host_blocked_ms": 0.112}]
    assert api.evidence["gpu_idle_after_them_ms"] == 0.02  # 130 -> 150 us, counted in sync_bound
    assert found["sync_bound"].est_gain_ms == pytest.approx(0.02)


def test_the_work_that_ends_a_gap_is_the_first_to_start_at_its_end():
    """The lookup behind each gap's launch: per device, the first work (in the trace's order)
    starting exactly at the gap's end; none for an end no work starts at, or a device without
    work; the same on a table not in start order."""
    import numpy as np

    from proflab.analysis.timeline.gaps import _work_starting_at

    work = pl.DataFrame(
        {"device": [0, 0, 0, 1, 0], "start_ns": [10, 20, 20, 20, 30], "correlation": [1, 2, 3, 4, None]},
        schema={"device": pl.Int32, "start_ns": pl.Int64, "correlation": pl.Int64},
    )
    ends = np.array([20, 25, 30, 40, 10, 5])
    assert _work_starting_at(work, 0, ends).to_list() == [2, None, None, None, 1, None]
    assert _work_starting_at(work, 1, ends).to_list() == [4, None, None, None, None, None]
    assert _work_starting_at(work, 7, ends).to_list() == [None] * 6
    shuffled = work[[4, 2, 0, 3, 1]]
    assert _work_starting_at(shuffled, 0, ends).to_list() == [3, None, None, None, 1, None]  # the first in its order
