"""User/NVTX ranges projected onto the GPU work they launched, checked against a plain-Python
projection over the raw trace (Kineto) and over the SQLite export (Nsight Systems)."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

import proflab
from proflab.analysis import Context
from proflab.report.assemble import report_for

KINETO = Path(__file__).parent / "data" / "kineto"
from shared_fixtures import NSYS  # noqa: E402


def _project(ranges, calls, work, name):
    """ranges: (name, tid, start, end); calls: corr -> (tid, start); work: (corr, device, dur)."""
    total = {}
    for corr, device, dur in work:
        if corr not in calls:
            continue
        tid, t = calls[corr]
        if any(n == name and rt == tid and s <= t < e for n, rt, s, e in ranges):
            total[device] = total.get(device, 0) + dur
    return total


def test_kineto_optimizer_step_gpu_time():
    path = KINETO / "train_loop.pt.trace.json.gz"
    with gzip.open(path, "rt") as fh:
        ev = json.load(fh)["traceEvents"]
    ns = lambda us: round(us * 1000)  # noqa: E731
    ranges = [(e["name"], e["tid"], ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in ev if e.get("cat") == "user_annotation"]
    calls = {e["args"]["correlation"]: (e["tid"], ns(e["ts"])) for e in ev
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}  # fmt: skip
    work = [(e["args"]["correlation"], e["args"]["device"], ns(e["dur"])) for e in ev
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]  # fmt: skip
    name = "Optimizer.step#AdamW.step"
    want = _project(ranges, calls, work, name)
    table = Context(proflab.load(path)).range_table
    got = {r["device"]: r["gpu_ns"] for r in table.filter(table["name"] == name).iter_rows(named=True)}
    assert want and got == want


@pytest.mark.skipif(not NSYS.exists(), reason="shared fixtures folder (../shared/fixtures/nsys) is absent")
def test_nsys_flash_attention_ranges_per_device():
    path = NSYS / "mfu_2gpu_before.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    g = lambda x: ((x >> 24) & 0xFFFFFF, x & 0xFFFFFF)  # noqa: E731  (pid, tid)
    # emit_nvtx appends ", seq = N, op_id = N" to names; the model keeps the operator name
    strip = lambda n: re.sub(r", (?:seq|op_id|sizes|input_op_ids) = .*$", "", n or "")  # noqa: E731
    ranges = [(strip(t or s), g(gt), a, b) for t, s, gt, a, b in con.execute(
        "SELECT n.text, (SELECT value FROM StringIds WHERE id = n.textId), n.globalTid, n.start, n.end "
        "FROM NVTX_EVENTS n WHERE n.end IS NOT NULL AND n.eventType IN (59, 60)")]  # fmt: skip
    calls = {(g(gt)[0], c): (g(gt), s) for gt, s, c in con.execute(
        "SELECT globalTid, start, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME")}  # fmt: skip
    work = [((gp >> 24) & 0xFFFFFF, c, d, e - s) for gp, c, d, s, e in con.execute(
        "SELECT globalPid, correlationId, deviceId, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL")]  # fmt: skip
    con.close()
    want = _project(ranges, calls, [((p, c), d, dur) for p, c, d, dur in work], "FlashAttnFunc")
    table = Context(proflab.load(path)).range_table
    got = {r["device"]: r["gpu_ns"] for r in table.filter(table["name"] == "FlashAttnFunc").iter_rows(named=True)}
    assert want and got == want and sorted(got) == [0, 1]


def test_projection_read_in_pieces_equals_whole(monkeypatch):
    """The projection reads the host table in pieces (bounded memory on exports with millions
    of ranges); pieces of 7 rows, so names and threads straddle them, give the same table."""
    from proflab.analysis.timeline import ranges as ranges_mod

    trace = proflab.load(KINETO / "train_loop.pt.trace.json.gz", cache=False)
    ctx = Context(trace)
    whole = ranges_mod.range_projection(trace, ctx.launches)
    assert whole.height > 0
    monkeypatch.setattr(ranges_mod, "_PIECE_ROWS", 7)
    assert ranges_mod.range_projection(trace, ctx.launches).equals(whole)


def _proflab_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name.startswith("proflab-")]


def test_the_report_gets_the_projection_built_beside_the_host_only_spans():
    """The report assembly builds the projection in a thread of its own while it builds the
    host-only spans: the same ranges as built alone, and no thread left after."""
    trace = proflab.load(KINETO / "train_loop.pt.trace.json.gz", cache=False)
    alone = Context(trace).range_table
    report = proflab.analyze(trace)
    assert [(r["name"], r["device"], r["gpu_ms"]) for r in report.ranges] == [
        (r["name"], r["device"], round(r["gpu_ns"] / 1e6, 3)) for r in alone.head(len(report.ranges)).iter_rows(named=True)
    ]
    assert report.ranges and not _proflab_threads()


def test_the_frames_index_built_beside_the_spans_is_the_one_built_alone():
    """The Python frames' index is built in a thread beside the spans too: the same frames,
    parents and hot kernels' source lines as in a context that builds it alone."""
    trace = proflab.load(KINETO / "train_loop.pt.trace.json.gz", cache=False)
    alone = Context(trace)
    ctx = Context(trace)
    report_for(ctx)
    assert len(ctx.frames) > 10_000 and ctx.frames.names.equals(alone.frames.names)
    assert (ctx.frames.parent_row == alone.frames.parent_row).all()
    assert ctx.hot_kernels(None).equals(alone.hot_kernels(None)) and not _proflab_threads()


@pytest.mark.parametrize(
    ("target", "what"),
    [("proflab.analysis.timeline.ranges.range_projection", "projection"), ("proflab.analysis.timeline.source.FrameIndex.__init__", "frames' index")],
)
def test_a_failure_beside_the_spans_reaches_the_caller(monkeypatch, target, what):
    """(Failures that no real input produces, made by replacing the projection or the frames'
    index: the error raised in its thread is the caller's, once the spans beside it are done,
    and no thread is left.)"""
    def broken(*args):
        raise RuntimeError(f"{what} failed")

    monkeypatch.setattr(target, broken)
    trace = proflab.load(KINETO / "train_loop.pt.trace.json.gz", cache=False)
    with pytest.raises(RuntimeError, match=f"{what} failed"):
        proflab.analyze(trace)
    assert not _proflab_threads()


def test_frames_parents_found_by_search_are_those_a_join_finds():
    """Kineto numbers Python frames as it records them (ids rising with start order), so each
    frame's parent row is found by a search of the ids; frames whose ids do not rise (here the
    same frames in reverse) are joined. Both give each frame its parent's row, -1 where the
    parent is not among the frames."""
    import numpy as np
    import polars as pl

    from proflab.analysis.timeline.source import FrameIndex, _parent_rows

    trace = proflab.load(KINETO / "train_loop.pt.trace.json.gz", cache=False)
    cols = ["tid", "start_ns", "python_id", "python_parent_id", "name"]
    frames = trace.cpu.filter(pl.col("cat") == "python_function").select(cols).with_row_index("row")
    assert frames.height > 10_000 and bool((np.diff(frames["python_id"].to_numpy()) > 0).all())
    searched = _parent_rows(frames)
    back = frames.reverse().drop("row").with_row_index("row")
    joined = _parent_rows(back)
    n = frames.height
    # the same parent, counted from the other end
    assert np.array_equal(searched, np.where(joined[::-1] >= 0, n - 1 - joined[::-1], -1))
    assert (searched >= 0).sum() > n // 2 and (searched == -1).any()
    ids, parents = frames["python_id"].to_numpy(), frames["python_parent_id"].to_numpy()
    found = searched >= 0
    assert np.array_equal(ids[searched[found]], parents[found])
    assert np.array_equal(FrameIndex(trace).parent_row, searched)


def _asof_rows(index, points):
    """What the frames' index found by an as-of join by thread before it searched keys: each
    instant's frame starting last at or before it on its thread, -1 where none."""
    import polars as pl

    frames = pl.DataFrame({"tid": index.frames_tid, "start_ns": index.starts}).with_row_index("row")
    got = (
        points.select(pl.col("tid").cast(pl.Int64), pl.col("t_ns").cast(pl.Int64)).with_row_index("_i")
        .sort("t_ns", nulls_last=True)
        .join_asof(frames.select("tid", "start_ns", pl.col("row").cast(pl.Int64)), left_on="t_ns", right_on="start_ns", by="tid",
                   check_sortedness=False)
        .sort("_i")
    )  # fmt: skip
    return got["row"].fill_null(-1).to_numpy()


def test_frames_innermost_by_search_is_the_as_of_join(monkeypatch):
    """The frame starting last at or before each instant on its thread, found by one search of
    (thread, start) keys, is the one an as-of join by thread finds: at the trace's launches,
    at every frame's own start (ties: the last of frames starting together), a ns before and
    after, before every frame and past the last, on a thread without frames, and where the
    time or thread is null."""
    import numpy as np
    import polars as pl

    from proflab.analysis.timeline import source

    tids = []
    real_init = source.FrameIndex._index_by_thread

    def keep_tids(self):  # (the index keeps no thread column once built: kept here to compare)
        self.frames_tid = self.frames["tid"].to_numpy()
        real_init(self)

    monkeypatch.setattr(source.FrameIndex, "_index_by_thread", keep_tids)
    trace = proflab.load(KINETO / "train_loop.pt.trace.json.gz", cache=False)
    launches = trace.cpu.filter(pl.col("cat") == "cuda_runtime").select("tid", pl.col("start_ns").alias("t_ns"))
    # the trace's frames, and the same with their starts rounded down to 10 us: frames
    # starting together (the order unchanged)
    rounded = trace.cpu.with_columns(
        pl.when(pl.col("cat") == "python_function").then(pl.col("start_ns") // 10_000 * 10_000).otherwise(pl.col("start_ns")).alias("start_ns")
    )  # fmt: skip
    ties = [_innermost_as_joined(source.FrameIndex(SimpleNamespace(cpu=cpu)), launches) for cpu in (trace.cpu, rounded)]
    assert ties == [False, True]


def _innermost_as_joined(index, launches):
    import numpy as np
    import polars as pl

    starts, ft = index.starts, index.frames_tid
    assert len(set(ft.tolist())) >= 2
    other = int(ft.max()) + 1
    points = pl.concat([
        launches,
        pl.DataFrame({"tid": ft, "t_ns": starts}),
        pl.DataFrame({"tid": ft, "t_ns": starts - 1}),
        pl.DataFrame({"tid": ft, "t_ns": starts + 1}),
        pl.DataFrame({"tid": [int(ft[0])] * 2 + [other], "t_ns": [int(starts.min()) - 10, int(starts.max()) + 10**12, int(starts[5])]}),
        pl.DataFrame({"tid": [None, int(ft[0])], "t_ns": [int(starts[5]), None]}, schema={"tid": pl.Int64, "t_ns": pl.Int64}),
    ], how="vertical_relaxed")  # fmt: skip
    t, found = index._innermost(points["tid"], points["t_ns"])
    expected = _asof_rows(index, points)
    assert np.array_equal(found, expected)
    assert (found >= 0).sum() > points.height // 2 and (found[-5:] == [-1, found[-4], -1, -1, -1]).all() and found[-4] >= 0
    return np.unique(starts).size < starts.size
