"""Golden tests of the Kineto reader on real recorded traces: the columnar model holds what
the JSON holds, however the file is compressed or sliced."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

import proflab
from proflab.readers import kineto

KINETO = Path(__file__).parent / "data" / "kineto"


def _raw(name: str) -> dict:
    with gzip.open(KINETO / name, "rt") as fh:
        return json.load(fh)


@pytest.mark.parametrize("name", ["train_loop.pt.trace.json.gz", "pageable_h2d.pt.trace.json.gz", "cpu_only_train.pt.trace.json.gz"])
def test_tables_hold_every_event(name):
    raw = _raw(name)
    cats = Counter(e.get("cat") for e in raw["traceEvents"] if e.get("ph") == "X")
    trace = proflab.load(KINETO / name)
    kinds = Counter(trace.gpu["kind"].cast(pl.String).to_list())
    assert kinds["kernel"] == cats["kernel"]
    assert kinds["memcpy"] == cats["gpu_memcpy"]
    assert kinds["memset"] == cats["gpu_memset"]
    host = Counter(trace.cpu["cat"].cast(pl.String).to_list())
    for cat in ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"):
        assert host[cat] == cats[cat], cat
    assert trace.meta.event_count == len(raw["traceEvents"])
    steps = [e for e in raw["traceEvents"] if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    assert trace.steps.height == len(steps) > 0


def test_kernel_fields_match_the_json():
    raw = _raw("train_loop.pt.trace.json.gz")
    k = next(e for e in raw["traceEvents"] if e.get("cat") == "kernel")
    trace = proflab.load(KINETO / "train_loop.pt.trace.json.gz")
    row = trace.gpu.filter(pl.col("correlation") == k["args"]["correlation"]).row(0, named=True)
    assert row["name"] == k["name"]
    assert row["start_ns"] == round(k["ts"] * 1000)
    assert row["dur_ns"] == round(k["dur"] * 1000)
    assert (row["grid_x"], row["grid_y"], row["grid_z"]) == tuple(k["args"]["grid"])
    assert (row["block_x"], row["block_y"], row["block_z"]) == tuple(k["args"]["block"])
    assert row["registers"] == k["args"]["registers per thread"]
    assert row["shared_mem_bytes"] == k["args"]["shared memory"]
    assert row["stream"] == k["args"]["stream"] and row["device"] == k["args"]["device"]


def test_memcpy_direction_and_memory_kinds():
    trace = proflab.load(KINETO / "pageable_h2d.pt.trace.json.gz")
    m = trace.memcpy
    assert m.height == 4
    assert set(m["copy_kind"].cast(pl.String)) == {"HtoD"}
    assert set(m["src_kind"].cast(pl.String)) == {"Pageable"}
    assert set(m["dst_kind"].cast(pl.String)) == {"Device"}
    assert m["bytes"].to_list() == [256 * 2**20] * 4


def test_device_properties():
    d = proflab.load(KINETO / "train_loop.pt.trace.json.gz").devices.row(0, named=True)
    assert d["name"] == "NVIDIA H100 80GB HBM3" and d["sm_count"] == 132 and d["compute_major"] == 9


def test_sliced_decode_equals_whole_decode(monkeypatch):
    """Kineto's layout is decoded a slice at a time; tiny slices must give the same tables."""
    path = KINETO / "train_loop.pt.trace.json.gz"
    whole = proflab.load(path)
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 4096)
    sliced = proflab.load(path)
    assert sliced.gpu.equals(whole.gpu) and sliced.cpu.equals(whole.cpu) and sliced.steps.equals(whole.steps)
    assert sliced.meta.event_count == whole.meta.event_count


def test_plain_json_and_reformatted_json_read_the_same(tmp_path):
    """export_chrome_trace output, decompressed; and the same events re-serialised compactly
    (not Kineto's layout, so the whole-document path)."""
    src = KINETO / "tiny_kernels_export_chrome.json.gz"
    plain = tmp_path / "plain.json"
    plain.write_bytes(gzip.decompress(src.read_bytes()))
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(json.loads(plain.read_text()), separators=(",", ":")))
    a, b, c = proflab.load(src), proflab.load(plain), proflab.load(compact)
    assert a.gpu.equals(b.gpu) and a.cpu.equals(b.cpu)
    assert a.gpu.equals(c.gpu) and a.cpu.equals(c.cpu) and a.steps.equals(c.steps)


def test_json_array_form(tmp_path):
    """The Chrome trace format also allows a bare array of events."""
    events = _raw("tiny_kernels_export_chrome.json.gz")["traceEvents"]
    path = tmp_path / "array.json"
    path.write_text(json.dumps(events))
    trace = proflab.load(path)
    assert trace.kernels.height == sum(1 for e in events if e.get("cat") == "kernel")


@pytest.fixture
def plain_train_loop(tmp_path):
    path = tmp_path / "train_loop.pt.trace.json"
    path.write_bytes(gzip.decompress((KINETO / "train_loop.pt.trace.json.gz").read_bytes()))
    return path


def test_helper_split_gives_identical_tables(monkeypatch, plain_train_loop):
    if not kineto.helper_allowed():
        pytest.skip("one core: the reader uses no helper process")
    # the helper process shares the slices where the compiled decoder is not built (with it,
    # two threads of this process decode them: tests/test_native_decoder.py)
    monkeypatch.setenv("PROFLAB_PURE_PYTHON", "1")
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 256 * 1024)  # ~30 slices, shared with the helper
    monkeypatch.setenv("PROFLAB_READ_PROCESSES", "1")
    single = proflab.load(plain_train_loop)
    monkeypatch.delenv("PROFLAB_READ_PROCESSES")
    started = []
    monkeypatch.setattr(kineto._Helper, "result", _spy(kineto._Helper.result, started))
    monkeypatch.setattr(kineto._Helper, "claim", _after_helper_starts(kineto._Helper.claim))
    split = proflab.load(plain_train_loop)
    assert started and started[0], "the helper process decoded no slice"
    assert split.gpu.equals(single.gpu) and split.cpu.equals(single.cpu) and split.steps.equals(single.steps)
    assert split.meta == single.meta


def test_a_helper_that_dies_costs_time_not_data(monkeypatch, plain_train_loop, tmp_path):
    """A helper that claims the last slices and then dies (a real process that exits 1 after
    making its claims, as one killed mid-read leaves them): this process decodes those
    slices too. One that never starts (``/bin/false``) leaves every slice here."""
    if not kineto.helper_allowed():
        pytest.skip("one core: the reader uses no helper process")
    # the helper process shares the slices where the compiled decoder is not built (with it,
    # two threads of this process decode them: tests/test_native_decoder.py)
    monkeypatch.setenv("PROFLAB_PURE_PYTHON", "1")
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 256 * 1024)
    monkeypatch.setenv("PROFLAB_READ_PROCESSES", "1")
    single = proflab.load(plain_train_loop)
    monkeypatch.delenv("PROFLAB_READ_PROCESSES")
    last = len(kineto.open_slicer(plain_train_loop, kineto._CHUNK_BYTES).plan()) - 1
    dies = tmp_path / "dies.sh"  # run as: dies.sh -m proflab.readers._worker TRACE OUTDIR
    dies.write_text(f'#!/bin/sh\ncat > /dev/null\ntouch "$4/claim-{last}" "$4/claim-{last - 1}" "$4/claim-{last - 2}"\nexit 1\n')
    dies.chmod(0o755)
    monkeypatch.setattr(kineto._Helper, "claim", _after_helper_starts(kineto._Helper.claim))
    # /bin/false may exit before the slices are written to it (the helper is then dropped at
    # once: None) or after (it claimed none: no tables, [])
    for helper, results_ok in ((str(dies), ([None],)), ("/bin/false", ([None], [[]]))):
        monkeypatch.setattr(kineto.sys, "executable", helper)
        results = []
        monkeypatch.setattr(kineto._Helper, "result", _spy(kineto._Helper.result, results))
        trace = proflab.load(plain_train_loop)
        assert results in results_ok, (helper, results)
        assert trace.gpu.equals(single.gpu) and trace.cpu.equals(single.cpu) and trace.meta == single.meta


def _spy(method, seen: list):
    def wrapper(self, *args):
        out = method(self, *args)
        seen.append(out)
        return out

    return wrapper


def _after_helper_starts(claim, timeout_s: float = 300.0):
    """``_Helper.claim`` that first waits (once) until the helper has claimed the last slice,
    so the helper surely decodes some on a loaded machine, where its start can take longer
    than this process needs for the whole file."""
    import functools
    import time

    @functools.wraps(claim)
    def wrapper(self, index):
        if index == 0 and self.proc is not None:
            last = Path(self.tmp.name) / f"claim-{self.slices - 1}"
            deadline = time.monotonic() + timeout_s
            while not last.exists() and self.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
        return claim(self, index)

    return wrapper


from shared_fixtures import FIXTURES  # noqa: E402

SHARED_CHROME = FIXTURES / "kineto" / "t4_power_iteration_baseline_nsys_chrome.json"


def test_chrome_json_from_nsys_is_refused_with_its_categories(capsys):
    """A real Chrome trace written from Nsight Systems is not a Kineto trace: one line, exit 2."""
    if not SHARED_CHROME.exists():
        pytest.skip("shared fixtures folder (../shared/fixtures) is absent")
    from proflab.cli import main

    assert main(["analyze", str(SHARED_CHROME)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert SHARED_CHROME.name in err and "'cuda_api'" in err and "'cuda'" in err


def test_helper_reports_values_it_dropped(monkeypatch, plain_train_loop):
    """An odd value in the file's last slice, which the helper decodes first: its slice is
    decoded tolerantly there, and the note reaches the trace as if the reader had decoded it
    itself."""
    if not kineto.helper_allowed():
        pytest.skip("one core: the reader uses no helper process")
    # the helper process shares the slices where the compiled decoder is not built (with it,
    # two threads of this process decode them: tests/test_native_decoder.py)
    monkeypatch.setenv("PROFLAB_PURE_PYTHON", "1")
    data = plain_train_loop.read_bytes()
    at = data.rindex(b'"args": {')
    plain_train_loop.write_bytes(data[:at] + b'"args": {\n      "grid": "grid(1,)",' + data[at + len(b'"args": {') :])
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 256 * 1024)
    started = []
    monkeypatch.setattr(kineto._Helper, "result", _spy(kineto._Helper.result, started))
    monkeypatch.setattr(kineto._Helper, "claim", _after_helper_starts(kineto._Helper.claim))
    split = proflab.load(plain_train_loop)
    assert started and started[0], "the helper process decoded no slice"
    assert "args.grid: 1 value was a string, ignored" in split.meta.notes
    monkeypatch.setenv("PROFLAB_READ_PROCESSES", "1")
    single = proflab.load(plain_train_loop)
    assert split.gpu.equals(single.gpu) and split.cpu.equals(single.cpu) and split.meta == single.meta


@pytest.mark.parametrize("inflater", ["isal", "zlib"])
def test_gzip_is_decompressed_a_read_at_a_time(monkeypatch, tmp_path, inflater):
    """A .gz file comes out in pieces of at most one read, however well it compresses (a
    whole 16 MiB read of a JSON trace decompressed at once was ~160 MiB), and nothing is lost
    at the end, in one member or several; with ISA-L's inflater and zlib's. Corrupt data is
    the one-line error naming the file, whichever inflates it."""
    from proflab.errors import CorruptInput
    from proflab.readers import _slices

    if inflater == "isal":
        pytest.importorskip("isal")
    else:
        monkeypatch.setenv("PROFLAB_ZLIB", "1")
    monkeypatch.setattr(_slices, "_READ_BYTES", 1 << 20)
    bad = bytearray(gzip.compress(b'{"traceEvents": [' + bytes(range(256)) * 4096 + b"]}"))
    bad[len(bad) // 2 : len(bad) // 2 + 64] = b"\xff" * 64
    (tmp_path / "bad.json.gz").write_bytes(bytes(bad))
    with pytest.raises(CorruptInput, match=r"bad\.json\.gz.*corrupt gzip data"):
        list(_slices.byte_chunks(tmp_path / "bad.json.gz"))
    data = b'{"traceEvents": [' + b" " * (6 << 20) + b"]}"
    for members in (1, 3):
        path = tmp_path / f"t{members}.json.gz"
        path.write_bytes(b"".join(gzip.compress(data) for _ in range(members)))
        chunks = list(_slices.byte_chunks(path))
        assert max(map(len, chunks)) <= 1 << 20
        assert b"".join(chunks) == data * members



def test_xz_is_decompressed_a_read_at_a_time(monkeypatch, tmp_path):
    """An .xz file as a .gz one: in pieces of at most one read, nothing lost at the end of
    one stream or of several (with the null padding xz allows between them), and corrupt or
    truncated data the one-line error naming the file."""
    import lzma

    from proflab.errors import CorruptInput, TruncatedInput
    from proflab.readers import _slices

    monkeypatch.setattr(_slices, "_READ_BYTES", 1 << 20)
    data = b'{"traceEvents": [' + b" " * (6 << 20) + b"]}"
    for streams in (1, 3):
        path = tmp_path / f"t{streams}.json.xz"
        path.write_bytes(b"\0\0\0\0".join(lzma.compress(data, preset=0) for _ in range(streams)))
        chunks = list(_slices.byte_chunks(path))
        assert max(map(len, chunks)) <= 1 << 20
        assert b"".join(chunks) == data * streams
    whole = lzma.compress(b'{"traceEvents": [' + bytes(range(256)) * 4096 + b"]}", preset=0)
    bad = bytearray(whole)
    bad[len(bad) // 2 : len(bad) // 2 + 64] = b"\xff" * 64
    (tmp_path / "bad.json.xz").write_bytes(bytes(bad))
    with pytest.raises(CorruptInput, match=r"bad\.json\.xz.*corrupt xz data"):
        list(_slices.byte_chunks(tmp_path / "bad.json.xz"))
    (tmp_path / "cut.json.xz").write_bytes(whole[:-8])
    with pytest.raises(TruncatedInput, match=r"cut\.json\.xz.*truncated"):
        list(_slices.byte_chunks(tmp_path / "cut.json.xz"))


def test_xz_size_is_read_from_its_index(tmp_path):
    """An xz file's JSON bytes come from its streams' indexes, exactly: empty to several MiB,
    one stream or several with padding between them, one block or many (``xz`` itself with
    ``--block-size``, where the tool is installed); a file whose index does not add up is
    estimated instead, on the large side."""
    import lzma
    import random
    import shutil
    import subprocess

    from proflab.readers._kineto_size import _XZ_RATIO, json_bytes

    rng = random.Random(0)
    words = [bytes(rng.choices(b"abcdefghij{}:,\" 0123456789", k=rng.randrange(1, 12))) for _ in range(500)]
    for n in (0, 1, 4095, 300_000, 2_000_000):
        data = b" ".join(rng.choices(words, k=n // 6 + 1))[:n]
        one = lzma.compress(data, preset=0)
        several = lzma.compress(data[:7], preset=0) + bytes(8) + one + bytes(4)
        for name, blob, raw in (("one", one, n), ("several", several, min(n, 7) + n)):
            path = tmp_path / f"{n}.{name}.json.xz"
            path.write_bytes(blob)
            assert json_bytes(path) == (raw, True), (n, name)
        if shutil.which("xz") and n:
            plain = tmp_path / f"{n}.json"
            plain.write_bytes(data)
            subprocess.run(["xz", "-0", "--block-size=65536", str(plain)], check=True)
            assert json_bytes(plain.with_name(plain.name + ".xz")) == (n, True)
    cut = tmp_path / "cut.json.xz"
    cut.write_bytes((tmp_path / "300000.one.json.xz").read_bytes()[:-20])
    assert json_bytes(cut) == (_XZ_RATIO * cut.stat().st_size, True)


def test_xz_trace_reads_as_its_gzip_twin(tmp_path, capsys):
    """A trace recompressed to xz is the same trace: the same report, named by the file, found
    in a folder of traces beside its gzip twin, and in a run directory, whose process record
    names it."""
    import lzma
    import shutil

    from proflab.cli import main
    from proflab.readers import expand_paths
    from proflab.readers.rundir import step_times_of

    gz = tmp_path / "h2d.pt.trace.json.gz"
    gz.write_bytes((KINETO / "pageable_h2d.pt.trace.json.gz").read_bytes())
    xz = tmp_path / "h2d.pt.trace.json.xz"
    xz.write_bytes(lzma.compress(gzip.decompress(gz.read_bytes()), preset=0))
    assert kineto.sniff(xz)
    reports = []
    for path in (gz, xz):
        assert main(["analyze", str(path), "-f", "json", "--no-cache"]) == 0
        reports.append(capsys.readouterr().out.replace(str(path), "TRACE"))
    assert reports[0] == reports[1] and json.loads(reports[0])["findings"]
    assert expand_paths([tmp_path]) == [gz, xz]
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    (run / "processes").mkdir()
    (run / "meta.json").write_text("{}")
    shutil.copy(xz, run / "traces" / xz.name)
    steps = {"bare_n": 20, "bare_ms": 5.0}
    (run / "processes" / "1.json").write_text(json.dumps({"traces": [f"traces/{xz.name}"], "step_times": steps}))
    assert expand_paths([run]) == [run / "traces" / xz.name]
    assert step_times_of(run / "traces" / xz.name) == steps


def test_gzip_falls_back_on_zlib_without_isal(monkeypatch):
    """Where ISA-L is not installed (no wheel for the machine) zlib inflates. (The missing
    package is made by hiding it from the import system: it is installed here.)"""
    import sys
    import zlib

    from proflab.readers import _slices

    monkeypatch.setitem(sys.modules, "isal", None)
    assert _slices._inflater() == (zlib.decompressobj, (zlib.error,))

@pytest.mark.parametrize(("slice_bytes", "piece_bytes"), [(1 << 10, 64 << 10), (64 << 10, 16 << 10), (64 << 10, 64 << 10), (256 << 10, 1 << 20)])
def test_streamed_slices_hold_every_event_once(slice_bytes, piece_bytes):
    """A compressed trace's slicer cuts the decompressed stream into slices that are each a
    JSON array of whole events, every event once and in order, whether the pieces it is fed
    are smaller or larger than a slice (the slice is then the buffer itself, or copied out of
    it); a slice's buffer holds at most a piece beyond the slice."""
    from proflab.readers import _slices

    events = [{"ph": "X", "name": "k" * (i % 97), "ts": i, "dur": 1, "args": {"n": "x" * (i * 37 % 500)}} for i in range(3000)]
    body = ",".join("\n  {\n    " + json.dumps(e)[1:-1] + "\n  }" for e in events)  # (Kineto's layout)
    doc = ('{"schemaVersion": 1, "traceEvents": [' + body + '\n], "displayTimeUnit": "ms"}').encode()
    sl = _slices.Slicer(slice_bytes)
    got, largest = [], 0
    for at in range(0, len(doc), piece_bytes):
        for piece in sl.feed(doc[at : at + piece_bytes]):
            got += json.loads(piece)
            largest = max(largest, len(piece))
            assert piece.__sizeof__() <= len(piece) + piece_bytes + 64
    for piece in sl.finish():
        got += json.loads(piece)
    assert got == events and largest < slice_bytes + 1024
    assert json.loads(sl.document()) == {"schemaVersion": 1, "traceEvents": [], "displayTimeUnit": "ms"}
