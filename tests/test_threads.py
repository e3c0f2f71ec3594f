"""ThreadClock: per-thread keys on one int64 line, and events of no known thread.

A Kineto trace's tid without digits (a thread named by text) reads as null; those events sit
in a band of their own, so they never meet a thread's events, and nothing downstream crashes
on them (launch_bound's optimizer split and the energy per range did, found in review)."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import polars as pl

import proflab
from proflab.analysis.context import Context
from proflab.analysis.energy import _range_energy
from proflab.analysis.timeline.threads import ThreadClock

REALISTIC = Path(__file__).resolve().parent / "data" / "realistic"


def test_unknown_thread_has_a_band_of_its_own():
    tids = pl.Series([7, 428, None], dtype=pl.Int64)
    t = pl.Series([100, 200, 150], dtype=pl.Int64)
    clock = ThreadClock([tids], [t])
    keys = clock.key(tids, t)
    assert keys.dtype == np.int64
    assert keys[0] < keys[1] < keys[2]  # 7's band, 428's, then the unknown thread's
    assert (keys[2] - keys[1]) > clock.span - (200 - 100) - 1
    tid, back = clock.unkey(keys)
    assert tid.tolist() == [7, 428, -1] and back.tolist() == [100, 200, 150]


def test_one_thread_and_unknown_never_share_keys():
    tids = pl.Series([1, None], dtype=pl.Int64)
    t = pl.Series([10, 10], dtype=pl.Int64)
    keys = ThreadClock([tids], [t]).key(tids, t)
    assert keys[0] != keys[1]


@pytest.mark.parametrize("threads", [1, 3, 8, 9, 40])
def test_ranks_are_the_threads_places_whatever_their_number(threads):
    """An event's rank is its thread's place among the clock's threads (found by comparing
    with each thread where there are at most eight, else by a search): the same as a
    dictionary of the threads gives, nulls after the threads, thread 0 and the largest ids
    included; rank_any gives -1 to nulls and to threads the clock does not know, and rank
    refuses those."""
    rng = np.random.default_rng(threads)
    ids = [0, 2**62, *rng.choice(10**6, threads - 2, replace=False).tolist()][:threads] if threads > 1 else [481]
    tid = pl.Series(rng.choice(ids, 5000).tolist() + [None] * 7, dtype=pl.Int64).shuffle(seed=1)
    clock = ThreadClock([tid], [pl.Series(range(tid.len()), dtype=pl.Int64)])
    place = {t: i for i, t in enumerate(sorted(ids))}
    want = [len(ids) if t is None else place[t] for t in tid.to_list()]
    assert clock.rank(tid).tolist() == want and clock.rank(tid).dtype == np.int16
    other = pl.Series([ids[0], 12345678901, None, ids[-1]], dtype=pl.Int64)
    assert clock.rank_any(other).tolist() == [place[ids[0]], -1, -1, place[ids[-1]]]
    assert clock.rank_any(tid.cast(pl.Int32, strict=False).drop_nulls().head(0)).size == 0
    with pytest.raises(ValueError, match="12345678901"):
        clock.rank(other)


def _with_text_tid(src, dst, pick) -> None:
    doc = json.load(gzip.open(src))
    for e in doc["traceEvents"]:
        if pick(e):
            e["tid"] = "optimizer"
            break
    with gzip.open(dst, "wt") as f:
        json.dump(doc, f)


def test_optimizer_range_on_an_unnamed_thread_keeps_the_report(tmp_path):
    src = REALISTIC / "mlp_foreach.light.pt.trace.json.gz"
    dst = tmp_path / "mlp_text_tid.pt.trace.json.gz"
    _with_text_tid(src, dst, lambda e: e.get("cat") == "user_annotation" and e.get("name", "").startswith("Optimizer.step#"))
    trace = proflab.load(dst)
    assert trace.cpu.filter(pl.col("name").str.starts_with("Optimizer.step#") & pl.col("tid").is_null()).height == 1
    got = [f.category for f in proflab.analyze(trace).findings]
    assert got == [f.category for f in proflab.analyze(proflab.load(src)).findings]


def test_range_energy_skips_launches_of_no_thread():
    trace = proflab.load(REALISTIC / "cnn_loader.light.pt.trace.json.gz")
    cpu = trace.cpu.with_row_index("_i")
    first = cpu.filter((pl.col("cat") == "cuda_runtime") & pl.col("correlation").is_in(trace.gpu["correlation"].implode()))["_i"][0]
    cpu = cpu.with_columns(pl.when(pl.col("_i") == first).then(None).otherwise(pl.col("tid")).alias("tid")).drop("_i")
    trace = dataclasses.replace(trace, cpu=cpu)
    rows = _range_energy(trace, Context(trace), None, 0, int(trace.gpu["device"][0]), 1e9)
    assert rows and rows[0]["name"].startswith("Optimizer.step#")


@pytest.mark.parametrize("copies", [64, 2])
def test_thread_order_is_a_stable_grouping_by_thread(monkeypatch, copies):
    """The order host-only spans walk events in: by thread band, each band's rows in their own
    order, the same as numpy's stable argsort of the ranks, across chunk boundaries (small
    chunks here, so a band's rows span many) and with the band of no known thread last; with
    each chunk's bands copied as runs, and (``copies`` 2: more threads in a chunk than that)
    every row scattered to its place."""
    import proflab.analysis.timeline.threads as threads

    monkeypatch.setattr(threads, "_ORDER_STEP", 7)
    monkeypatch.setattr(threads, "_BAND_COPIES", copies)
    rng = np.random.default_rng(3)
    picks = rng.choice(4, size=1000, p=[0.6, 0.2, 0.15, 0.05])
    tids = pl.Series([(5, 17, 4242, None)[i] for i in picks], dtype=pl.Int64)
    clock = ThreadClock([tids], [pl.Series([0, 10], dtype=pl.Int64)])
    rank = clock.rank(tids)
    order, per_band = clock.thread_order(rank)
    assert order.tolist() == np.argsort(rank, kind="stable").tolist()
    assert per_band.tolist() == [int((tids == t).sum()) for t in (5, 17, 4242)] + [tids.null_count()]
