"""Host-only spans (``observer.host_only_spans``): annotations that launched nothing and long
stretches between a thread's recorded events, checked on a real trace and against a
brute-force reference on random threads."""

from __future__ import annotations

from unittest import mock

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

import proflab
from proflab.analysis.context import Context
from proflab.analysis.timeline import observer
from proflab.analysis.timeline.observer import QUIET_STRETCH_NS, host_only_spans
from proflab.model.trace import CPU_SCHEMA, DEVICE_SCHEMA, GPU_SCHEMA, STEP_SCHEMA, Trace, TraceMeta

OUTSIDE = "(outside operators)"


def test_stretches_stay_between_their_threads_events(find_trace):
    """train_loop has four host threads; a stretch is bounded by two events of its own thread.
    (Keys of all threads in one sort once ran a thread's last event into the next thread's
    first: a 74.6 ms "stretch" on autograd's thread, past its last event and the window.)"""
    trace = proflab.load(find_trace("train_loop"))
    spans = Context(trace).host_only.filter(pl.col("name") == OUTSIDE)
    assert spans.height > 10
    events = trace.cpu.filter(pl.col("cat").is_in(["cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"]))
    bounds = events.group_by("tid").agg(
        pl.col("start_ns").min().alias("first"), (pl.col("start_ns") + pl.col("dur_ns")).max().alias("last")
    )
    joined = spans.join(bounds, on="tid", how="left")
    assert joined["first"].null_count() == 0
    assert (joined["start_ns"] >= joined["first"]).all() and (joined["end_ns"] <= joined["last"]).all()
    assert ((joined["end_ns"] - joined["start_ns"]) >= QUIET_STRETCH_NS).all()


def test_a_thread_waiting_on_one_that_dispatches_is_not_working():
    """The DataLoader-fed CNN: the main thread records nothing inside loss.backward() while
    autograd's thread runs the backward, and autograd's thread nothing while the main one
    runs the forward or loads the batch. Only time when no thread that launches records
    work, or the loader's __next__, is work that launches nothing: each step's loader
    (27 ms) and stretches of at most 0.5 ms, not 2-3 ms of backward a step on the main
    thread nor 30 ms of forward and loading on autograd's."""
    trace = proflab.load("tests/data/gains/cnn_loader.base.pt.trace.json.gz")
    spans = Context(trace).host_only.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("d"))
    loader = spans.filter(pl.col("name").str.contains("DataLoader"))
    assert loader.height == 4 and (loader["d"] > 26_000_000).all()
    outside = spans.filter(pl.col("name") == OUTSIDE)
    # autograd's thread idles through the loader (the main thread records only the loader's own
    # few operators then; before the first, autograd's thread has recorded nothing): that
    # stays; nothing else on either thread is longer than 0.5 ms
    during = outside.join_where(loader.select(pl.col("start_ns").alias("l0"), pl.col("end_ns").alias("l1")),
                                pl.col("start_ns") < pl.col("l1"), pl.col("end_ns") > pl.col("l0"))  # fmt: skip
    assert during.height == 3 and loader["tid"][0] not in during["tid"].to_list()
    rest = outside.filter(~pl.col("start_ns").is_in(during["start_ns"].implode()))
    assert rest.height >= 4 and rest["d"].max() < 500_000


def _trace(cpu_rows: list[dict], launches: list[tuple[int, int]]) -> tuple[Trace, pl.DataFrame]:
    cpu = pl.DataFrame(
        [{c: r.get(c) for c in CPU_SCHEMA} for r in cpu_rows] or None, schema=CPU_SCHEMA
    ).sort("start_ns", maintain_order=True)
    trace = Trace(
        gpu=pl.DataFrame(schema=GPU_SCHEMA), cpu=cpu, steps=pl.DataFrame(schema=STEP_SCHEMA),
        devices=pl.DataFrame(schema=DEVICE_SCHEMA), meta=TraceMeta(source="synthetic", format="test"),
    )  # fmt: skip
    lt = pl.DataFrame(
        {"tid": [t for t, _ in launches], "launch_start_ns": [s for _, s in launches]},
        schema={"tid": pl.Int64, "launch_start_ns": pl.Int64},
    )
    return trace, lt


def _minus(a: int, b: int, cover: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[a, b) less the union of ``cover``, one instant at a time in spirit: walked in order."""
    out, at = [], a
    for s, e in sorted(cover):
        if e <= at or s >= b:
            continue
        if s > at:
            out.append((at, s))
        at = max(at, e)
    if at < b:
        out.append((at, b))
    return out


def _reference(cpu_rows: list[dict], launches: list[tuple[int, int]]) -> set[tuple]:
    out = set()
    quiet = []
    for i, r in enumerate(cpu_rows):  # annotations (not PyTorch's own) with no launch of their thread inside
        end = r["start_ns"] + r["dur_ns"]
        if r["cat"] == "user_annotation" and not r["name"].startswith("aten::") and end > r["start_ns"]:
            if not any(t == r["tid"] and r["start_ns"] <= s < end for t, s in launches):
                out.add((r["tid"], r["name"], r["start_ns"], end))
                quiet.append(i)
    # what the threads that launch record, less the annotations that launched nothing
    quiet_spans = [(cpu_rows[i]["start_ns"], cpu_rows[i]["start_ns"] + cpu_rows[i]["dur_ns"]) for i in quiet]
    busy = [
        piece
        for i, r in enumerate(cpu_rows)
        if r["tid"] in {t for t, _ in launches} and i not in quiet
        for piece in _minus(r["start_ns"], r["start_ns"] + r["dur_ns"], quiet_spans)
    ]
    for tid in {r["tid"] for r in cpu_rows}:  # gaps in the union of the thread's events, less busy time
        spans = sorted((r["start_ns"], r["start_ns"] + r["dur_ns"]) for r in cpu_rows if r["tid"] == tid)
        reach = spans[0][1]
        for s, e in spans[1:]:
            if s - reach >= QUIET_STRETCH_NS:
                out.update((tid, OUTSIDE, a, b) for a, b in _minus(reach, s, busy) if b - a >= QUIET_STRETCH_NS)
            reach = max(reach, e)
    return out


_event = st.fixed_dictionaries({
    "cat": st.sampled_from(["cpu_op", "user_annotation", "cuda_runtime"]),
    "name": st.sampled_from(["load_batch", "aten::mm", "log", "cudaLaunchKernel"]),
    "tid": st.sampled_from([7, 428, 2**40]),
    "start_ns": st.integers(0, 3_000_000),
    "dur_ns": st.integers(0, 600_000),
})  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(_event, min_size=1, max_size=30),
    launches=st.lists(st.tuples(st.sampled_from([7, 428, 2**40]), st.integers(0, 3_600_000)), max_size=10),
)
def test_matches_brute_force(events, launches):
    trace, lt = _trace(events, launches)
    got = host_only_spans(trace, lt)
    assert set(got.iter_rows()) == _reference(events, launches)
    assert got["start_ns"].is_sorted()


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(_event, min_size=1, max_size=30),
    launches=st.lists(st.tuples(st.sampled_from([7, 428, 2**40]), st.integers(0, 3_600_000)), max_size=10),
    chunk=st.integers(1, 4),
)
def test_matches_brute_force_a_few_events_at_a_time(events, launches, chunk):
    """The events are keyed and searched a chunk at a time (a million on a real export): a
    stretch across a chunk's edge, and the running maximum of ends carried over it, come out
    as in one piece."""
    trace, lt = _trace(events, launches)
    with mock.patch.object(observer, "_CHUNK_ROWS", chunk):
        got = host_only_spans(trace, lt)
    assert set(got.iter_rows()) == _reference(events, launches)
    assert got.equals(host_only_spans(trace, lt))


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(st.integers(-5, 40), max_size=30),
    s=st.lists(st.integers(-10, 50), max_size=40),
    ordered=st.booleans(),
)
def test_launches_found_by_searching_them_among_the_events(keys, s, ordered):
    """The first launch at or after each event's start, found by searching the launches among
    the starts (starts in order, fewer launches in their range than starts) or, where that does
    not hold, the starts among the launches: the same places either way, ties included."""
    import numpy as np

    k = np.sort(np.array(keys + [np.iinfo(np.int64).max], dtype=np.int64))
    starts = np.array(sorted(s) if ordered else s, dtype=np.int64)
    got = observer._first_at_or_after(k, starts)
    assert got.tolist() == np.searchsorted(k, starts, side="left").tolist()


def test_events_per_step_counted_by_running_sums_as_one_by_one():
    """The observer's events and Python frames per step: times in order (a host table's
    starts) are counted by a search of each step's bounds and running sums; they give what
    placing each time in its step gives (the last step starting at or before it, while not
    yet ended), with steps that overlap, start together or hold nothing, times before, between
    and after them, and times out of order (placed one by one)."""
    import numpy as np

    from proflab.analysis.timeline.observer import _counts_per_step, _step_of

    rng = np.random.default_rng(7)
    for _ in range(500):
        lo = np.sort(rng.integers(0, 100, rng.integers(1, 8)))
        hi = lo + rng.integers(0, 40, lo.size)
        t = np.sort(rng.integers(-5, 150, rng.integers(0, 60)))
        flag = rng.random(t.size) < 0.4
        k = _step_of(t, lo, hi)
        want = [np.bincount(k[m], minlength=lo.size + 1)[: lo.size].tolist() for m in (~flag, flag)]
        shuffled = rng.permutation(t.size)
        for times, flags in ((t, flag), (t[shuffled], flag[shuffled])):
            assert [c.tolist() for c in _counts_per_step(times, flags, lo, hi)] == want
