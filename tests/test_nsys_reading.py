"""How the Nsight Systems reader reads: the time-order merge, emit_nvtx names cut to the operator, file
names SQLite's URI syntax would misread, and values of the wrong type."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import proflab
from proflab.cli import main
from proflab.model.trace import CPU_SCHEMA
from proflab.model.slicing import parse_window
from proflab.readers import _export_rows, nsys_sqlite
from proflab.readers._merge import gather_text, merge_by_start

from shared_fixtures import NSYS  # noqa: E402
T4 = NSYS / "t4_power_iteration_baseline.sqlite"


def _cpu(starts: list[int], name: str, **cols) -> pl.DataFrame:
    n = len(starts)
    data = {c: [None] * n for c in CPU_SCHEMA}
    data.update(cat=["cuda_runtime"] * n, name=[f"{name}{i}" for i in range(n)], start_ns=starts, dur_ns=[1] * n, **cols)
    return pl.DataFrame(data, schema=CPU_SCHEMA)


def test_merge_orders_by_start_keeps_table_order_on_ties_and_the_schema():
    a = _cpu([30, 10, 20], "a", tid=[1, 2, 3])
    b = _cpu([20, 5], "b", tid=[4, 5])
    merged = merge_by_start([a, b])
    assert merged.schema == pl.Schema(CPU_SCHEMA)
    assert merged["start_ns"].to_list() == [5, 10, 20, 20, 30]
    assert merged["name"].to_list() == ["b1", "a1", "a2", "b0", "a0"]  # a's 20 before b's 20
    assert merged["tid"].to_list() == [5, 2, 3, 4, 1]  # rows stay whole
    assert merged["python_id"].null_count() == 5  # a column nobody fills stays null


def test_merge_keeps_epoch_nanoseconds_exact_and_puts_rows_without_a_start_first():
    """Starts past float64's exact integers (Unix-epoch ns) order exactly, also when a part
    holds a row without a start (an export's damaged row, dropped after the merge)."""
    t = 1_700_000_000_000_000_000
    merged = merge_by_start([_cpu([t + 3, None, t + 1], "a"), _cpu([t + 2], "b")])
    assert merged["start_ns"].to_list() == [None, t + 1, t + 2, t + 3]
    assert merged["name"].to_list() == ["a1", "a2", "b0", "a0"]


def test_merge_of_one_sorted_part_and_of_nothing():
    one = merge_by_start([_cpu([1, 2, 3], "x"), _cpu([], "y")])
    assert one["name"].to_list() == ["x0", "x1", "x2"]
    none = merge_by_start([_cpu([], "x"), _cpu([], "y")])
    assert none.height == 0 and none.schema == pl.Schema(CPU_SCHEMA)


def test_merge_of_parts_in_chunks_is_that_of_the_same_parts_whole():
    """Parts whose columns come in several chunks (as polars' streaming engine gives a table)
    merge to what the same parts in one chunk each merge to; the parts given are not changed."""
    rng = np.random.default_rng(7)
    parts = [_cpu(rng.integers(0, 10_000, 500).tolist(), f"p{k}_", tid=rng.integers(1, 4, 500).tolist(),
                  python_id=[None if i % 3 else i for i in range(500)]) for k in range(5)]
    chunked = [pl.concat([p.slice(0, 100), p.slice(100, 250), p.slice(350)], rechunk=False) for p in parts]
    assert all(c.get_column("tid").n_chunks() == 3 for c in chunked)
    kept = [c.clone() for c in chunked]
    merged = merge_by_start(list(chunked))
    assert merged.equals(merge_by_start([p.rechunk() for p in parts]))
    assert merged.height == 2_500 and merged["start_ns"].is_sorted()
    assert all(c.equals(k) and c.get_column("tid").n_chunks() == 3 for c, k in zip(chunked, kept, strict=True))


_piece = st.sampled_from(["aten::addmm", "forward, layer 3", ", seq = 4", ", op_id = 99", ", sizes = [[2, 3]]",
                          ", input_op_ids = [1]", ", seq=4", "x", ", ", " = ", "é"])  # fmt: skip


def _cut_at_first_key(text: str) -> str:
    """The operator name emit_nvtx put before its first ", key = " (the reference, in Python)."""
    at = [text.find(f", {k} = ") for k in ("seq", "op_id", "sizes", "input_op_ids")]
    at = [i for i in at if i >= 0]
    return text[: min(at)] if at else text


@given(st.lists(st.lists(_piece, max_size=6).map("".join), max_size=8))
@example(texts=["éaten::addmm, seq = 4"])  # (polars 2.2's str.find counts characters, 2.1's bytes)
def test_inline_nvtx_text_is_cut_to_the_operator_once_per_distinct_text(texts):
    """Inline NVTX text (unique per row under emit_nvtx) is cut as StringIds text is (at its
    first key, by byte offset: "é" before it stays whole), once per distinct text; rows keep
    codes into the dictionary, and a text that is empty, or cut to nothing, has no code (the
    row's textId names it instead)."""
    ctx = nsys_sqlite._Ctx(Path("x.sqlite"), None, None, set(), None)
    codes = ctx.text_codes(pl.Series(texts, dtype=pl.String).replace("", None), nsys_sqlite._operator_only)
    dictionary = pl.concat(ctx._texts) if ctx._texts else pl.Series(dtype=pl.String)
    got = [None if c is None else dictionary[c] for c in codes.to_list()]
    cut = nsys_sqlite._operator_only(pl.Series(texts, dtype=pl.String)).to_list()
    assert cut == [_cut_at_first_key(t) for t in texts]
    assert got == [c or None for c in cut]
    assert dictionary.len() == len({c for c in cut if c})  # each name once


@pytest.mark.skipif(not T4.exists(), reason="shared fixtures folder (../shared/fixtures/nsys) is absent")
@pytest.mark.parametrize("name", ["run?x=1.sqlite", "run#2.sqlite", "100%done.sqlite"])
def test_file_names_with_uri_characters_are_read(tmp_path, name):
    path = tmp_path / name
    shutil.copyfile(T4, path)
    trace = proflab.load(path)
    assert trace.gpu.height == proflab.load(T4).gpu.height > 0


def test_value_of_the_wrong_type_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    """SQLite stores any type in any column. A text value among the times of a runtime table
    (the driver types each column from its first batch) is a schema error, not a traceback."""
    path = tmp_path / "odd.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute("INSERT INTO StringIds VALUES (1, 'cudaLaunchKernel_v7000')")
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, globalTid INTEGER, "
                "correlationId INTEGER, nameId INTEGER)")  # fmt: skip
    rows = [(i * 10, i * 10 + 5, (7 << 24) + 7, i, 1) for i in range(8)] + [("late", 95, (7 << 24) + 7, 9, 1)]
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, ?)", rows)
    con.commit()
    con.close()
    before = path.read_bytes()
    monkeypatch.setattr(nsys_sqlite, "_BATCH_ROWS", 4)  # the bad row then falls in a later batch
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "odd.sqlite" in err and "Traceback" not in err
    assert path.read_bytes() == before


def _fake_nsys(tmp_path, monkeypatch, body: str) -> None:
    """A stand-in for `nsys export` (no nsys can run here): the conversion's plumbing is real,
    the converter is not. ``body`` is shell run with $OUT set to the --output path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in --output=*) OUT="${a#--output=}";; esac; done\n' + body)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


@pytest.mark.skipif(not T4.exists(), reason="shared fixtures folder (../shared/fixtures/nsys) is absent")
def test_nsys_rep_is_exported_then_read_as_nsys_rep(tmp_path, monkeypatch):
    _fake_nsys(tmp_path, monkeypatch, f'cp "{T4}" "$OUT"\n')
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"not read by proflab itself")
    trace = proflab.load(rep)
    assert trace.meta.format == "nsys-rep" and trace.meta.source == str(rep)
    assert trace.gpu.height == proflab.load(T4).gpu.height
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "run.nsys-rep"]  # nothing left beside it


def test_nsys_rep_that_nsys_cannot_export_is_one_line(tmp_path, monkeypatch, capsys):
    _fake_nsys(tmp_path, monkeypatch, 'echo "ERROR: the report is from a newer version" >&2\nexit 1\n')
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00" * 64)
    assert main(["analyze", str(rep)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "run.nsys-rep" in err and "newer version" in err
    assert err.count(str(rep)) == 1


@pytest.mark.skipif(not T4.exists(), reason="shared fixtures folder (../shared/fixtures/nsys) is absent")
def test_reading_in_small_chunks_gives_the_same_trace(monkeypatch):
    """Tables are read a rowid range at a time; the seams between chunks must not show."""
    from polars.testing import assert_frame_equal

    whole = proflab.load(T4)
    monkeypatch.setattr(nsys_sqlite, "_CHUNK_ROWS", 97)  # every table of the export spans many chunks
    chunked = proflab.load(T4)
    assert_frame_equal(chunked.gpu, whole.gpu)
    assert_frame_equal(chunked.cpu, whole.cpu)
    assert_frame_equal(chunked.steps, whole.steps)


def test_merged_text_is_gathered_through_a_dictionary():
    """The merge must give the same text as concatenate-then-gather, nulls included."""
    a = pl.Series("name", ["k" * 200, None, "short", "k" * 200])
    b = pl.Series("name", ["short", "other" * 40, None])
    order = pl.Series([6, 0, 4, 2, 1, 5, 3], dtype=pl.UInt32)
    want = pl.concat([a, b]).gather(order)
    got = gather_text([a, b], order)
    assert got.name == "name" and got.to_list() == want.to_list()
    # mostly null (gathered as it is, not through the dictionary): the same text
    sparse = [pl.Series("dims", [None] * 9 + ["[[8, 16]]"]), pl.Series("dims", [None, "[]", None, None])]
    order = pl.Series([13, 9, 0, 10, 5, 11, 1, 2, 3, 4, 6, 7, 8, 12], dtype=pl.UInt32)
    got = gather_text(sparse, order)
    assert got.name == "dims" and got.to_list() == pl.concat(sparse).gather(order).to_list()
    assert got.to_list()[1] == "[[8, 16]]" and got.to_list()[5] == "[]" and got.null_count() == 12


def test_a_tables_rowid_bounds_are_two_seeks_not_a_scan(tmp_path):
    """A large table is read in rowid ranges; finding its first and last rowid must not read
    it: in one select, min() and max() together scanned every row (0.5 s of 8.6 M NVTX rows
    on the main thread). The query plan seeks the rowid B-tree twice and scans nothing; the
    bounds are those of the table, with and without rows."""
    con = sqlite3.connect(tmp_path / "t.sqlite")
    con.execute('CREATE TABLE "NVTX_EVENTS" (start INTEGER, text TEXT)')
    assert con.execute(_export_rows.rowid_bounds("NVTX_EVENTS")).fetchone() == (None, None)
    con.executemany('INSERT INTO "NVTX_EVENTS" (rowid, start, text) VALUES (?, ?, ?)', [(i * 3 - 5, i, "x") for i in range(1000)])
    plan = [row[3] for row in con.execute("EXPLAIN QUERY PLAN " + _export_rows.rowid_bounds("NVTX_EVENTS"))]
    assert [p for p in plan if p.startswith("SEARCH")] == ["SEARCH NVTX_EVENTS"] * 2
    assert not any(p.startswith("SCAN NVTX_EVENTS") for p in plan)
    assert con.execute(_export_rows.rowid_bounds("NVTX_EVENTS")).fetchone() == (-5, 2992)


H100 = NSYS / "h100_2gpu_1s.sqlite"


@pytest.mark.skipif(not H100.exists(), reason="shared fixtures folder (../shared/fixtures/nsys) is absent")
def test_read_reports_its_progress_over_the_event_tables(monkeypatch):
    """A large export takes seconds to read: each piece of an event table read reports the
    share of all event tables' rows done, rising to 1 (as a Kineto trace's bytes do); a part
    read reports too. Nothing is reported without a sink."""
    from proflab.readers import _progress

    monkeypatch.setattr(nsys_sqlite, "_CHUNK_ROWS", 2048)  # many pieces
    seen: list = []
    with _progress.reporting(seen.append):
        whole = nsys_sqlite.read(H100)
    assert len(seen) > 10 and seen == sorted(seen) and seen[-1] == 1.0 and seen[0] > 0
    seen.clear()
    with _progress.reporting(seen.append):
        nsys_sqlite.read(H100, parse_window("100ms:200ms"))
    assert len(seen) > 10 and seen == sorted(seen) and seen[-1] == 1.0
    assert whole.cpu.height > 10_000
    nsys_sqlite.read(H100)  # no sink: nothing to report to, and no error
    assert _progress._sink is None


@pytest.mark.skipif(not H100.exists(), reason="shared fixtures folder (../shared/fixtures/nsys) is absent")
def test_table_rows_counts_the_event_tables_without_reading_them(tmp_path):
    con = sqlite3.connect(H100)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    counted = {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in _export_rows.EVENT_TABLES if t in tables}
    con.close()
    assert nsys_sqlite.table_rows(H100) == counted and sum(counted.values()) > 10_000
    not_sqlite = tmp_path / "t.json"
    not_sqlite.write_text("{}")
    assert nsys_sqlite.table_rows(not_sqlite) is None


@pytest.mark.skipif(not H100.exists(), reason="shared fixtures folder (../shared/fixtures/nsys) is absent")
def test_a_whole_read_that_would_not_fit_is_warned_about_first(monkeypatch, capsys):
    """Before an export is read whole, one line on stderr when the memory a read and analysis
    are estimated to need exceeds what is available, naming the ways to read less;
    the report follows as usual. A machine short of memory for a fixture cannot be had here:
    the available memory is set low, the one thing not real in this test."""
    import json

    from proflab.cli import _reading

    monkeypatch.setattr(_reading, "available_memory", lambda: 1 << 20)
    assert main(["analyze", str(H100), "--no-cache", "-f", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["findings"]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("proflab: warning: h100_2gpu_1s.sqlite holds ")
    assert "events; reading and analysing it whole needs about 163 MB" in lines[0] and " 1 MB is available" in lines[0]
    assert "--memory-budget, --steps or --window" in lines[0]
    assert main(["analyze", str(H100), "--no-cache", "-f", "json", "--window", "0ms:100ms"]) == 0
    assert capsys.readouterr().err == ""  # a part: no warning
    monkeypatch.setattr(_reading, "available_memory", lambda: 1 << 40)
    assert main(["analyze", str(H100), "--no-cache", "-f", "json"]) == 0
    assert capsys.readouterr().err == ""


def test_an_integer_every_row_holds_alike_is_broadcast_as_it_reads():
    """A process's pid, the same in every row of every part, is not gathered: the merged
    column holds it in every row all the same. A column constant but for a null, or constant
    within each part but not across them, is gathered as ever."""
    a = _cpu([30, 10, 20], "a", pid=[7, 7, 7], tid=[1, 1, 1], sequence=[3, None, 3])
    b = _cpu([20, 5], "b", pid=[7, 7], tid=[2, 2], sequence=[3, 3])
    merged = merge_by_start([a, b])
    assert merged.schema == pl.Schema(CPU_SCHEMA)
    assert merged["pid"].to_list() == [7] * 5
    assert merged["tid"].to_list() == [2, 1, 1, 2, 1]
    assert merged["sequence"].to_list() == [3, None, 3, 3, 3]
    assert merged.filter(pl.col("pid") == 7).height == 5 and merged.group_by("pid").len()["len"].to_list() == [5]
