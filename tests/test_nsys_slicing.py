"""``--steps`` / ``--window`` on an Nsight Systems export: the part is cut inside SQLite (only
rows that can belong to it are read), and the result is exactly what reading the whole export
and slicing it gives: the same events, steps, notes and event count.

The shared exports have no profiler steps; ``with_steps`` adds ProfilerStep#N ranges on the
busiest runtime thread (half named inline, half through StringIds, as nsys writes either)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

import proflab
from proflab.errors import UsageError
from proflab.model.slicing import parse_steps, parse_window, slice_trace
from proflab.readers import load

from shared_fixtures import NSYS  # noqa: E402


def with_steps(src: Path, dst: Path, n: int = 8, first: int = 10) -> Path:
    """A copy of ``src`` with ``n`` consecutive ProfilerStep ranges numbered from ``first``."""
    shutil.copyfile(src, dst)
    dst.chmod(0o644)
    con = sqlite3.connect(dst)
    try:
        tid, t0, t1 = con.execute(
            "SELECT globalTid, min(start), max(end) FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY globalTid ORDER BY count(*) DESC LIMIT 1"
        ).fetchone()
        sid = con.execute("SELECT max(id) FROM StringIds").fetchone()[0] + 1
        width = (t1 - t0) // n
        for i in range(n):
            a, b, name = t0 + i * width, t0 + (i + 1) * width - 1000, f"ProfilerStep#{first + i}"
            if i % 2:
                con.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (sid + i, name))
                con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, textId) VALUES (?, ?, 59, ?, ?)", (a, b, tid, sid + i))
            else:
                con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text) VALUES (?, ?, 59, ?, ?)", (a, b, tid, name))
        con.commit()
    finally:
        con.close()
    return dst


@pytest.fixture(scope="module", params=["h100_2gpu_1s", "mfu_2gpu_after"])
def export(request, tmp_path_factory) -> Path:
    src = NSYS / f"{request.param}.sqlite"
    if not src.exists():
        pytest.skip("shared fixtures folder (../shared/fixtures/nsys) is absent")
    return with_steps(src, tmp_path_factory.mktemp("slicing") / f"{request.param}.sqlite")


SPECS = ["steps 10", "steps 11:15", "steps 16:", "steps :12", "steps 99:", "window 0:50", "window 100ms:300ms", "window 300:",
         "window :1", "window 5s:6s"]  # fmt: skip


@pytest.mark.parametrize("text", SPECS)
def test_part_read_in_sqlite_is_the_whole_read_sliced(export, text):
    kind, arg = text.split()
    spec = parse_steps(arg) if kind == "steps" else parse_window(arg)
    whole = load(export, cache=False)
    try:
        want = slice_trace(whole, spec)
    except UsageError as e:
        with pytest.raises(UsageError) as got:
            load(export, cache=False, part=spec)
        assert str(got.value) == str(e)
        return
    got = load(export, cache=False, part=spec)
    for table in ("gpu", "cpu", "steps", "devices", "comms"):
        assert_frame_equal(getattr(got, table), getattr(want, table))
    assert got.meta.notes == want.meta.notes
    assert got.meta.event_count == whole.meta.event_count  # the export's, not the part's
    assert got.cpu.height < whole.cpu.height


def test_part_report_is_the_whole_reads(export):
    spec = parse_steps("12:14")
    want = proflab.analyze(slice_trace(load(export, cache=False), spec)).to_dict()
    got = proflab.analyze(load(export, cache=False, part=spec)).to_dict()
    assert got == want


def test_broken_exports_read_in_part_end_cleanly(tmp_path):
    """The fuzzing suite's broken Nsight Systems exports, read with a part: a trace or one
    clean line (a part's own SQL once met text in an integer column with a TypeError)."""
    from fuzzing import Builder

    from proflab.errors import ProflabError

    builder = Builder(tmp_path)
    if builder.available("nsys"):
        pytest.skip(builder.available("nsys"))
    for i in range(150):
        case = builder.build("nsys", i)
        for spec in (parse_window("0:50"), parse_steps("1:3")):
            try:
                load(case.paths[0], cache=False, part=spec)
            except ProflabError as e:
                assert "\n" not in str(e) and str(case.paths[0]) in str(e), (i, spec.text, str(e))
