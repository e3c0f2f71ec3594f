"""The compiled column reader of Nsight Systems exports (``readers/_sqlscan.c``,
``readers/_sqlite_native.py``) against the ADBC driver it stands in for.

What it accepts must read exactly as the driver's path reads it (the real exports, whole and in
small pieces on two threads; values at the edges of their types; emit_nvtx text cut as
``_operator_only`` cuts it), and everything else must be given up, so that the driver's path
reads it as it always has: a damaged export refused or read alike either way (the fuzzing
suite's own mutations of the real exports)."""

from __future__ import annotations

import json
import random
import sqlite3
import threading
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import proflab
from fuzzing import nsys_seed, nsys_sources, sqlite_mutation
from proflab.errors import ProflabError
from proflab.readers import _sqlite_native as native
from proflab.readers import nsys_sqlite
from proflab.readers._export_rows import read_only_uri

pytestmark = pytest.mark.skipif(
    not native.available(),
    reason="the compiled column reader is not built (no C compiler at install), found no SQLite library, or PROFLAB_PURE_PYTHON is set",
)

EXPORTS = nsys_sources()
_CUTS = nsys_sqlite._EMIT_NVTX_CUTS


def _db(tmp_path: Path, rows: list[tuple], decl: str = "a INTEGER, b TEXT") -> Path:
    p = tmp_path / "t.sqlite"
    con = sqlite3.connect(p)
    con.execute(f"CREATE TABLE t ({decl})")
    con.executemany(f"INSERT INTO t VALUES ({', '.join('?' * len(rows[0]))})", rows)
    con.commit()
    con.close()
    return p


def _read(path: Path, sql: str, schema: dict, cut: tuple[bytes, ...] = (), rows: int = 0):
    cons = native.Connections(read_only_uri(path))
    try:
        return cons.frame(sql, schema, cut, rows)
    finally:
        cons.close()


def _trace(path: Path, monkeypatch, *, pure: bool, chunk: int | None = None):
    with monkeypatch.context() as m:
        if pure:
            m.setenv("PROFLAB_PURE_PYTHON", "1")
        if chunk:
            m.setattr(nsys_sqlite, "_CHUNK_ROWS", chunk)
        return proflab.load(path, cache=False)


def _same_trace(a, b) -> None:
    assert a.gpu.schema == b.gpu.schema and a.cpu.schema == b.cpu.schema
    assert a.gpu.equals(b.gpu) and a.cpu.equals(b.cpu)
    assert a.steps.equals(b.steps) and a.devices.equals(b.devices)
    assert a.meta == b.meta


@pytest.mark.parametrize("path", EXPORTS, ids=[p.stem for p in EXPORTS])  # (a list: pytest 7.0 calls an ids function on an empty set's placeholder)
@pytest.mark.parametrize("chunk", [None, 997], ids=["whole", "pieces"])
def test_a_real_export_reads_as_through_the_driver(path, chunk, monkeypatch):
    """Every table of every real export, whole and in pieces of 997 rows (read ahead by the
    two reading threads): the same trace as through the ADBC driver, and the same report."""
    ours = _trace(path, monkeypatch, pure=False, chunk=chunk)
    theirs = _trace(path, monkeypatch, pure=True, chunk=chunk)
    _same_trace(ours, theirs)
    assert ours.cpu.height and ours.gpu.height
    a, b = proflab.analyze(ours).to_dict(), proflab.analyze(theirs).to_dict()
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def test_the_reader_is_what_reads_them(monkeypatch):
    """(Not a vacuous comparison: the compiled reader does read the event tables, and the
    driver is not called for any piece of a real export.) Nothing it made outlives the trace."""
    path = next((p for p in EXPORTS if "mfu" in p.stem), None) or pytest.skip("no emit_nvtx export in the shared fixtures")
    calls = {"native": 0, "driver": 0}
    frame, adbc = native.Connections.frame, nsys_sqlite._Ctx._fetch_adbc

    def counted_frame(self, *a, **k):
        calls["native"] += 1
        return frame(self, *a, **k)

    def counted_adbc(self, *a, **k):
        calls["driver"] += 1
        return adbc(self, *a, **k)

    import gc

    from proflab.readers import _sqlscan

    monkeypatch.setattr(native.Connections, "frame", counted_frame)
    monkeypatch.setattr(nsys_sqlite._Ctx, "_fetch_adbc", counted_adbc)
    gc.collect()
    before = _sqlscan.live()
    trace = proflab.load(path, cache=False)
    assert calls["native"] >= 5 and calls["driver"] == 0, calls
    del trace
    gc.collect()
    assert _sqlscan.live() == before  # (every array the reader made is released with the trace)


def test_values_at_the_edges_of_their_types(tmp_path):
    big, small = 2**63 - 1, -(2**63)
    rows = [(big, "é€😀"), (small, ""), (None, None), (0, "x" * (1 << 20)), (-1, "a\x00b")]
    p = _db(tmp_path, rows)
    got = _read(p, "SELECT a, b FROM t ORDER BY rowid", {"a": pl.Int64, "b": pl.String})
    assert got["a"].to_list() == [r[0] for r in rows]
    assert got["b"].to_list() == [r[1] for r in rows]
    assert got.schema == {"a": pl.Int64, "b": pl.String}


def test_rows_beyond_the_room_made_at_first_and_nulls_throughout(tmp_path):
    """70,000 rows read with room for 3 at first (grown by doubling): every value and null
    in its place, and a text column of only nulls and empty text."""
    rng = random.Random(7)
    rows = [(None if rng.random() < 0.3 else rng.randrange(-(10**12), 10**12), None if i % 3 == 0 else "" if i % 3 == 1 else f"n{i}",
             None if i % 2 else "")  # fmt: skip
            for i in range(70_000)]
    p = _db(tmp_path, rows, "a INTEGER, b TEXT, c TEXT")
    schema = {"a": pl.Int64, "b": pl.String, "c": pl.String}
    got = _read(p, "SELECT a, b, c FROM t ORDER BY rowid", schema, rows=3)
    assert got.height == 70_000
    assert got.rows() == rows
    assert got["a"].null_count() == sum(r[0] is None for r in rows)


def test_an_empty_result_and_null_literals(tmp_path):
    p = _db(tmp_path, [(1, "a")])
    empty = _read(p, "SELECT a, b FROM t WHERE a > 5", {"a": pl.Int64, "b": pl.String})
    assert empty.height == 0 and empty.schema == {"a": pl.Int64, "b": pl.String}
    nulls = _read(p, "SELECT NULL, NULL, a + 1 FROM t", {"x": pl.Int32, "y": pl.String, "z": pl.Int64})
    assert nulls.rows() == [(None, None, 2)]


@pytest.mark.parametrize(
    ("rows", "decl", "sql"),
    [
        ([(1.5, "a")], "a REAL, b TEXT", "SELECT a, b FROM t"),  # a REAL in an integer column
        ([("12", "a")], "a TEXT, b TEXT", "SELECT a, b FROM t"),  # text where an integer belongs
        ([(1, b"\x00\x01")], "a INTEGER, b BLOB", "SELECT a, b FROM t"),  # a BLOB where text belongs
        ([(1, 5)], "a INTEGER, b INTEGER", "SELECT a, b FROM t"),  # an integer where text belongs
        ([(1, "a")], "a INTEGER, b TEXT", "SELECT a, b, a FROM t"),  # more columns than kinds
        ([(1, "a")], "a INTEGER, b TEXT", "SELECT a, nope FROM t"),  # an SQL error
    ],
    ids=["real", "text-for-integer", "blob", "integer-for-text", "column-count", "sql-error"],
)
def test_what_it_gives_up_on(tmp_path, rows, decl, sql):
    p = _db(tmp_path, rows, decl)
    assert _read(p, sql, {"a": pl.Int64, "b": pl.String}) is None


@pytest.mark.parametrize("raw", [b"\xff", b"ab\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"ok\xe2\x82"],
                         ids=["ff", "cut-short", "surrogate", "overlong", "above-max", "cut-3"])
def test_text_that_is_not_utf8_is_given_up(tmp_path, raw):
    """SQLite keeps whatever bytes it was given as TEXT; Python's strict codec is the rule
    (the driver's path repairs such text and says so in the notes)."""
    p = _db(tmp_path, [(1, "a")])
    con = sqlite3.connect(p)
    con.execute("UPDATE t SET b = CAST(? AS TEXT)", (raw,))
    con.commit()
    con.close()
    assert _read(p, "SELECT a, b FROM t", {"a": pl.Int64, "b": pl.String}) is None


_TEXT = st.lists(
    st.sampled_from(["a", "é", "😀", ",", " ", "=", "seq", "op_id", "sizes", "input_op_ids", ", seq = ", ", op_id", " = ", "1", "[", "]"]),
    max_size=12,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(_TEXT, min_size=1, max_size=20))
def test_emit_nvtx_text_is_cut_as_the_operator_only_rule_cuts_it(tmp_path_factory, texts):
    p = _db(tmp_path_factory.mktemp("cut"), [(i, t) for i, t in enumerate(texts)])
    got = _read(p, "SELECT a, b FROM t ORDER BY a", {"a": pl.Int64, "b": pl.String}, _CUTS)
    expected = nsys_sqlite._operator_only(pl.Series(texts, dtype=pl.String))
    assert got["b"].to_list() == expected.to_list()


def test_text_as_codes_into_its_distinct_texts(tmp_path):
    """A coded column: a UInt32 code a row (null for NULL) into the distinct texts in the order
    first met, cut before coding; 70,000 distinct texts (the table grown many times), texts
    of one length that differ in one byte, and empty text are each their own."""
    texts = [None, "b", "", "a, seq = 1", "a, seq = 2", "b", None, "a"] + [f"t{i:07d}" for i in range(70_000)] + ["t0000001", "t0000010"]
    p = _db(tmp_path, list(enumerate(texts)))
    got = _read_coded(p, "SELECT a, b FROM t ORDER BY a", _CUTS)
    assert isinstance(got, native.Coded) and got.frame.schema == {"a": pl.Int64, "b": pl.UInt32}
    distinct = got.texts["b"]
    assert distinct.dtype == pl.String
    assert distinct.head(4).to_list() == ["b", "", "a", "t0000000"]
    assert distinct.len() == 3 + 70_000
    assert distinct.gather(got.frame["b"]).to_list() == [None if t is None else t.split(", seq = ")[0] for t in texts]


def test_a_coded_column_of_only_nulls(tmp_path):
    p = _db(tmp_path, [(1, None), (2, None)])
    got = _read_coded(p, "SELECT a, b FROM t")
    assert got.texts["b"].len() == 0 and got.frame["b"].null_count() == 2


def _read_coded(path: Path, sql: str, cut: tuple[bytes, ...] = ()):
    cons = native.Connections(read_only_uri(path))
    try:
        return cons.frame(sql, {"a": pl.Int64, "b": pl.String}, cut, 0, ("b",))
    finally:
        cons.close()


def test_a_column_dropped_frees_its_memory(tmp_path):
    """Each column owns its memory (an Arrow array of its own, counted by the reader): the
    text of a piece is freed once its column goes, not kept alive by the integer columns kept
    from it (what ``_detached`` copies the driver's batches for), and nothing outlives them."""
    import gc

    from proflab.readers import _sqlscan

    p = _db(tmp_path, [(i, "x" * 100) for i in range(1000)])
    gc.collect()
    before = _sqlscan.live()
    got = _read(p, "SELECT a, b FROM t", {"a": pl.Int64, "b": pl.String})
    kept = got.get_column("a")
    assert _sqlscan.live() == before + 2
    del got
    gc.collect()
    assert _sqlscan.live() == before + 1 and kept.sum() == sum(range(1000))
    del kept
    gc.collect()
    assert _sqlscan.live() == before


def test_cut_markers_must_share_one_ascii_first_byte(tmp_path):
    from proflab.readers import _sqlscan

    p = _db(tmp_path, [(1, "a")])
    con = _sqlscan.open(read_only_uri(p))
    try:
        with pytest.raises(ValueError):
            _sqlscan.read(con, "SELECT a, b FROM t", b"it", ("a", "b"), (b", x", b"; y"))
        with pytest.raises(ValueError):
            _sqlscan.read(con, "SELECT a, b FROM t", b"it", ("a", "b"), (b"",))
        with pytest.raises(ValueError):
            _sqlscan.read(con, "SELECT a, b FROM t", b"ix", ("a", "b"))
    finally:
        _sqlscan.close(con)
    with pytest.raises(RuntimeError):
        _sqlscan.read(con, "SELECT a, b FROM t", b"it", ("a", "b"))


def test_a_connection_per_thread(tmp_path):
    """Two threads reading at once through one ``Connections`` each get a connection of
    their own (a SQLite connection opened without its mutex serves one thread at a time)."""
    p = _db(tmp_path, [(i, f"r{i}") for i in range(50_000)])
    cons = native.Connections(read_only_uri(p))
    got: list = [None, None]

    def run(i: int) -> None:
        got[i] = [cons.frame("SELECT a, b FROM t", {"a": pl.Int64, "b": pl.String}).height for _ in range(5)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cons.close()
    assert got == [[50_000] * 5] * 2


def _outcome(path: Path):
    try:
        trace = proflab.load(path, cache=False)
    except ProflabError as e:
        return ("refused", type(e).__name__, str(e))
    try:
        return ("read", json.dumps(proflab.analyze(trace).to_dict(), sort_keys=True, default=str))
    except ProflabError as e:
        return ("refused in analysis", type(e).__name__, str(e))


@pytest.mark.parametrize("index", range(40))
def test_a_damaged_export_reads_or_is_refused_alike(tmp_path, index, monkeypatch):
    """The fuzzing suite's mutations of the real exports (wrong types, text columns, hostile
    and megabyte strings, extreme starts, dropped columns and tables): the same report, or
    the same refusal, with the compiled reader as through the driver alone."""
    sources = EXPORTS or pytest.skip("shared fixtures absent")
    rng = random.Random(f"sqlite-native:{index}")
    p = nsys_seed(rng.choice(sources), tmp_path / "report.sqlite")
    for _ in range(rng.choice((1, 2))):
        sqlite_mutation(p, rng)
    ours = _outcome(p)
    monkeypatch.setenv("PROFLAB_PURE_PYTHON", "1")
    assert _outcome(p) == ours


def test_turned_off_or_without_sqlite_or_stale_it_is_not_used(monkeypatch):
    """``PROFLAB_PURE_PYTHON=1``, no SQLite library found, or an in-place build of another
    version of the source (a stand-in module plays that build): the driver reads it all."""
    import importlib
    import sys
    import types

    from proflab import readers

    monkeypatch.setenv("PROFLAB_PURE_PYTHON", "1")
    assert not native.available()
    monkeypatch.delenv("PROFLAB_PURE_PYTHON")
    try:
        monkeypatch.setattr(native, "_bound", None)
        monkeypatch.setattr(native, "_library_paths", lambda: ["/nonexistent/libsqlite3.so.0"])
        assert not native.available()
        stale = types.ModuleType("proflab.readers._sqlscan")
        stale.version = lambda: 0
        monkeypatch.setitem(sys.modules, "proflab.readers._sqlscan", stale)
        monkeypatch.setattr(readers, "_sqlscan", stale, raising=False)
        assert not importlib.reload(native).available()
    finally:
        monkeypatch.undo()
        importlib.reload(native)
    assert native.available()
    assert nsys_sqlite.native.available()


def _proflab_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("proflab-")]


def test_a_read_that_fails_before_the_nvtx_table_leaves_no_domain_scan_behind(tmp_path, monkeypatch):
    """The NVTX domain scan starts with the read (in pieces here: 997 rows); a kernel table
    without its correlation ids is refused first, naming the column, and the scan is waited
    for: no thread left."""
    src = next((p for p in EXPORTS if "mfu" in p.stem), None) or pytest.skip("no export with NVTX ranges in the shared fixtures")
    p = tmp_path / "report.sqlite"
    p.write_bytes(src.read_bytes())
    con = sqlite3.connect(p)
    con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN correlationId")
    con.commit()
    con.close()
    monkeypatch.setattr(nsys_sqlite, "_CHUNK_ROWS", 997)
    started = []
    prefetch = nsys_sqlite._Ctx.prefetch_domains

    def seen(self):
        prefetch(self)
        started.append(self._domain_pool is not None)

    monkeypatch.setattr(nsys_sqlite._Ctx, "prefetch_domains", seen)
    with pytest.raises(ProflabError, match="correlationId"):
        proflab.load(p, cache=False)
    assert started == [True] and not _proflab_threads()


def test_a_failure_beside_the_host_tables_read_reaches_the_caller(monkeypatch):
    """(A failure no real export produces, made by replacing the merge: the GPU tables'
    merge runs beside the host tables' read, and its error is the caller's, with no thread
    left.)"""
    path = EXPORTS[0] if EXPORTS else pytest.skip("shared fixtures absent")
    merge = nsys_sqlite.merge_by_start

    def broken(parts):
        if parts and "kind" in parts[0].columns:  # the GPU tables'
            raise RuntimeError("merge failed")
        return merge(parts)

    monkeypatch.setattr(nsys_sqlite, "merge_by_start", broken)
    with pytest.raises(RuntimeError, match="merge failed"):
        proflab.load(path, cache=False)
    assert not _proflab_threads()


def test_the_reader_benchmark_runs_on_a_real_export():
    """``benchmarks/bench_export_reader.py`` on a real export: a row for each event table and
    the whole read both ways (what it prints is measured there; here, that it runs)."""
    import subprocess
    import sys

    path = next((p for p in EXPORTS if "mfu" in p.stem), None) or pytest.skip("no export with NVTX ranges in the shared fixtures")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_export_reader.py"
    got = subprocess.run([sys.executable, str(script), "--export", str(path)], capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr
    out = got.stdout
    assert "NVTX_EVENTS" in out and "CUPTI_ACTIVITY_KIND_KERNEL" in out and "the driver alone takes" in out
    assert "compiled reader" in out and "ADBC driver alone" in out
