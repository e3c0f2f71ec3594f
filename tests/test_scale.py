"""Traces of any size: bounded memory on a realistic-shape trace (issue 20).

The trace comes from ``benchmarks/gen_realistic.py`` (one hot host thread, forward/backward
ranges over thousands of GPU gaps, NCCL on a second stream), built from the recorded
``train_loop`` trace. No timing asserts: the memory bound is what holds on any machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from peak_rss import analyze_peak

ROOT = Path(__file__).resolve().parent.parent
# (not `from conftest import`: on pytest 7.0 to 8.0 that named tests/gpu/conftest.py)
KINETO_DIR = ROOT / "tests" / "data" / "kineto"
GEN = ROOT / "benchmarks" / "gen_realistic.py"
SOURCE = KINETO_DIR / "train_loop.pt.trace.json.gz"

# The bound: peak RSS <= 0.4 x the uncompressed Kineto size + 300 MB.
MB = 10**6


def _bound_bytes(size: int) -> float:
    return 0.4 * size + 300 * MB


def _generated(tmp_path_factory, size_mb: int) -> Path:
    if not SOURCE.exists():
        pytest.skip(f"missing recorded trace {SOURCE.name}")
    out = tmp_path_factory.mktemp("scale") / "realistic.json"
    subprocess.run([sys.executable, str(GEN), str(out), "--size-mb", str(size_mb)], check=True, capture_output=True, timeout=600)
    return out


@pytest.fixture(scope="module")
def realistic(tmp_path_factory) -> Path:
    return _generated(tmp_path_factory, 30)


def _env() -> dict[str, str]:
    # the child imports the proflab under test, as this process does
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def test_generated_trace_has_the_realistic_shape(realistic):
    """What makes the trace hard is there: a hot thread, long ranges, NCCL, many gaps."""
    from proflab import load
    from proflab.analysis import Context

    assert 28 * MB < realistic.stat().st_size < 60 * MB
    t = load(realistic, cache=False)
    host = t.cpu.group_by("tid").len().sort("len", descending=True)
    assert host["len"][0] > 0.9 * t.cpu.height  # one hot host thread
    assert t.cpu.filter(pl.col("cat") == "cpu_op").height > 20_000
    assert t.steps.height >= 2
    assert t.gpu.filter(pl.col("is_comm"))["stream"].unique().to_list() == [20]
    assert t.gpu.filter(~pl.col("is_comm"))["stream"].unique().to_list() == [7]
    assert t.cpu.filter(pl.col("cat") == "gpu_user_annotation").height == t.steps.height
    gaps = Context(t).gaps
    assert gaps.height > 3_000
    ranges = t.cpu.filter(pl.col("name").is_in(["## forward ##", "## backward ##"]))
    assert ranges.height == 2 * t.steps.height
    # each backward range spans a thousand gaps or more
    bwd = ranges.filter(pl.col("name") == "## backward ##").row(0, named=True)
    inside = gaps.filter((pl.col("start_ns") >= bwd["start_ns"]) & (pl.col("start_ns") < bwd["start_ns"] + bwd["dur_ns"]))
    assert inside.height >= 1_000
    # every kernel has its launch: correlation ids match a runtime call
    launched = t.gpu.join(t.cpu.filter(pl.col("correlation").is_not_null()), on="correlation", how="semi")
    assert launched.height == t.gpu.height


def test_analyze_peak_rss_within_bound(realistic, tmp_path):
    """`proflab analyze` in a subprocess: its peak RSS (and its helper's) stays under
    0.4 x the trace size + 300 MB, and the report is the full one."""
    out = tmp_path / "report.json"
    rc, peak, err = analyze_peak(realistic, out)
    assert rc == 0, err
    size = realistic.stat().st_size
    assert peak <= _bound_bytes(size), f"peak RSS {peak / 2**20:.0f} MiB > bound {_bound_bytes(size) / 2**20:.0f} MiB"
    report = json.loads(out.read_text())
    assert report["source"]["inputs"][0]["events"] > 90_000
    assert sum(report["idle"]["gaps_by_cause"].values()) > 3_000


def _relaid(src: Path, out: Path, layout: str) -> Path:
    """``src`` written again in another JSON layout: compact (one line), one compact event a
    line, or ``indent=2``."""
    doc = json.loads(src.read_text())
    if layout == "indent2":
        out.write_text(json.dumps(doc, indent=2))
        return out
    events = doc.pop("traceEvents")
    head = json.dumps(doc, separators=(",", ":"))[:-1]
    sep = ",\n" if layout == "lines" else ","
    out.write_text(head + ',"traceEvents":[' + sep.join(json.dumps(e, separators=(",", ":")) for e in events) + "]}")
    return out


BUDGET = "300M"  # (above the 30 MB trace's whole analysis, ~250 MB: read whole in every layout)


@pytest.mark.parametrize("layout", ["compact", "lines", "indent2"])
def test_a_memory_budget_holds_in_every_json_layout(realistic, tmp_path, layout):
    """Issue 54: a trace in a layout other than Kineto's is cut by a scan of its structure,
    which touches every byte of the mapped file, and its slices are copied out. The scan's
    16 MiB reads held ~150 MiB of offsets at once, and the mapped pages it and the copies
    read stayed resident: the 185 MB realistic trace, one compact event a line, peaked at
    445 MiB under a budget of 400M (Kineto's layout: 260). Within 10 % of the budget here."""
    trace = _relaid(realistic, tmp_path / f"{layout}.json", layout)
    rc, peak, err = analyze_peak(trace, tmp_path / "report.json", "--memory-budget", BUDGET)
    assert rc == 0, err
    budget = 300 * MB
    assert peak <= 1.1 * budget, f"{layout}: peak RSS {peak / 2**20:.0f} MiB > 1.1 x the budget ({1.1 * budget / 2**20:.0f} MiB)"


@pytest.fixture(scope="module")
def realistic_100(tmp_path_factory) -> Path:
    return _generated(tmp_path_factory, 100)


@pytest.mark.parametrize("layout", ["compact", "lines", "indent2"])
def test_a_memory_budget_holds_in_every_gzipped_json_layout(realistic_100, tmp_path, layout):
    """Issue 54: a gzip stream in a layout other than Kineto's is sliced by its structure as it
    is inflated; each slice was copied out of the stream's buffer and the buffer let go of those
    bytes only after the slice was decoded, so every slice was held twice: a 100 MB realistic
    trace peaked at 215-230 MB under a budget of 200M (the 185 MB one 12-15 % over). The buffer
    now becomes the slice, as in Kineto's layout. Within 10 % of the budget."""
    import gzip

    plain = _relaid(realistic_100, tmp_path / f"{layout}.json", layout)
    trace = tmp_path / f"{layout}.json.gz"
    with plain.open("rb") as src, gzip.open(trace, "wb", compresslevel=1) as dst:
        shutil.copyfileobj(src, dst, 16 << 20)
    plain.unlink()
    rc, peak, err = analyze_peak(trace, tmp_path / "report.json", "--memory-budget", "200M")
    assert rc == 0, err
    budget = 200 * MB
    assert peak <= 1.1 * budget, f"{layout}: peak RSS {peak / 2**20:.0f} MiB > 1.1 x the budget ({1.1 * budget / 2**20:.0f} MiB)"


def test_slicer_finds_the_events_array_before_a_trailing_object(tmp_path):
    """A document with an object after traceEvents (distributedInfo written last) is still
    read slice by slice, not decoded whole (which needs several times the memory)."""
    from proflab.readers import kineto

    ev = '  {\n    "ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": %d, "dur": 2\n  }'
    body = ",\n".join(ev % i for i in range(5))
    doc = '{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + body + '\n  ],\n  "distributedInfo": {\n    "rank": 0\n  }\n}\n'
    p = tmp_path / "t.json"
    p.write_text(doc)
    json.loads(doc)  # valid JSON
    doc_, tables, _ = kineto._read_sliced(p)
    assert sum(t.events for t in tables) == 5
    assert doc_.distributedInfo == {"rank": 0}


# -- the columnar cache ---------------------------------------------------------------------


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("PROFLAB_CACHE_DIR", str(d))
    monkeypatch.setenv("PROFLAB_CACHE_MIN_MB", "0")
    monkeypatch.delenv("PROFLAB_NO_CACHE", raising=False)
    return d


@pytest.fixture()
def small(tmp_path) -> Path:
    """A real recorded trace, copied (the cache keys on path, size and mtime)."""
    if not SOURCE.exists():
        pytest.skip(f"missing recorded trace {SOURCE.name}")
    p = tmp_path / "train.pt.trace.json.gz"
    p.write_bytes(SOURCE.read_bytes())
    return p


def _same(a, b) -> None:
    for name in ("gpu", "cpu", "steps", "devices"):
        assert getattr(a, name).equals(getattr(b, name)), name
    assert a.meta == b.meta


def _entries(d: Path) -> list[Path]:
    """The table entries (reports are kept in their own folder)."""
    return [p for p in d.iterdir() if not p.name.startswith(".") and p.name != "reports"] if d.exists() else []


def test_cache_round_trip_gives_the_same_trace(cache_dir, small):
    from proflab.readers import load

    fresh = load(small, cache=False)
    assert _entries(cache_dir) == []  # cache=False writes nothing
    first = load(small)
    assert len(_entries(cache_dir)) == 1
    again = load(small)
    _same(fresh, first)
    _same(fresh, again)
    # nothing left behind but the entry (no temporary folders)
    assert [p.name for p in cache_dir.iterdir()] == [p.name for p in _entries(cache_dir)]


def test_the_shapes_are_kept_as_codes_read_fresh_or_from_the_cache(cache_dir, small):
    """A model repeats a few hundred distinct shapes over its operators: the host table keeps
    them as codes (4 bytes a row; a string view took 16 and its text: 85 MiB of the 514 MB
    benchmark trace's tables, 15 now), read fresh or from the cache, and their text is the
    trace's own."""
    import json

    from proflab.readers import load

    fresh, _ = load(small, cache=False), load(small)
    cached = load(small)
    for t in (fresh, cached):
        for c in ("input_types", "input_dims", "input_concrete"):
            col = t.cpu.get_column(c)
            assert col.dtype == pl.Categorical and col.null_count() < t.cpu.height
            assert col.estimated_size() <= 4.2 * t.cpu.height + 64 * col.n_unique(), c
    dims = fresh.cpu.get_column("input_dims").drop_nulls().cast(pl.String).unique().to_list()
    assert len(dims) > 50 and all(isinstance(json.loads(d), list) for d in dims)
    assert fresh.cpu.get_column("input_types").cast(pl.String).str.contains("float").any()


def _analyze(*args: str) -> str:
    from proflab.cli import main

    out = Path(args[0]).parent / "out.txt"
    assert main(["analyze", *args, "-o", str(out)]) == 0
    return out.read_text()


@pytest.mark.parametrize("fmt", ["json", "term", "md"])
def test_cached_report_is_the_fresh_one(cache_dir, small, fmt):
    """A repeated analyze comes from the report cache and prints exactly what a fresh
    analysis prints; other options are other entries."""
    fresh = _analyze(str(small), "-f", fmt, "--no-cache")
    assert not (cache_dir / "reports").exists()
    first = _analyze(str(small), "-f", fmt)
    (report,) = (cache_dir / "reports").iterdir()
    again = _analyze(str(small), "-f", fmt)
    assert fresh == first == again
    top3 = _analyze(str(small), "-f", fmt, "--top", "3")
    steps = _analyze(str(small), "-f", fmt, "--steps", "4:5")
    assert len(list((cache_dir / "reports").iterdir())) == 3
    assert top3 == _analyze(str(small), "-f", fmt, "--top", "3", "--no-cache") != fresh
    assert steps == _analyze(str(small), "-f", fmt, "--steps", "4:5", "--no-cache") != fresh
    report.write_text('{"_version": "x", "report": {')  # damaged: analysed again, rewritten
    assert _analyze(str(small), "-f", fmt) == fresh
    assert json.loads(report.read_text())["_version"] != "x"


def test_cached_report_needs_no_tables(cache_dir, small):
    """The repeated analyze reads one JSON file: polars is never imported."""
    from proflab.cli import main

    assert main(["analyze", str(small), "-f", "json", "-o", str(small.parent / "a.json")]) == 0
    code = ("import sys; from proflab.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, 'polars' in sys.modules, 'numpy' in sys.modules)")
    env = dict(_env(), PROFLAB_CACHE_DIR=str(cache_dir), PROFLAB_CACHE_MIN_MB="0")
    for fmt in ("json", "term", "md"):
        r = subprocess.run([sys.executable, "-c", code, "analyze", str(small), "-f", fmt, "-o", str(small.parent / f"b.{fmt}")],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.stdout.split() == ["0", "False", "False"], r.stderr
    assert (small.parent / "a.json").read_text() == (small.parent / "b.json").read_text()


def test_cache_is_trimmed_least_recently_used_first(cache_dir, small, tmp_path, monkeypatch, capsys):
    import time

    from proflab.cli import main
    from proflab.readers import _cachedir, load

    other = tmp_path / "other.pt.trace.json.gz"
    other.write_bytes((KINETO_DIR / "sync_every_step.pt.trace.json.gz").read_bytes())
    load(small)
    (old,) = _entries(cache_dir)
    time.sleep(0.05)
    load(other)
    newer = [e for e in _entries(cache_dir) if e != old]
    os.utime(old, (time.time() + 5, time.time() + 5))  # used since: now the most recent
    sizes = {e.path: e.bytes for e in _cachedir.entries(cache_dir)}
    _cachedir.trim(cache_dir, limit=sizes[old])
    assert _entries(cache_dir) == [old]
    # a temporary entry left by a killed run goes once it is old
    stale = cache_dir / f".{'a' * 32}.x1y2"
    stale.mkdir()
    mine = [cache_dir / "notes.txt", cache_dir / ("b" * 32 + ".csv"), cache_dir / "reports" / "keep.json"]
    (cache_dir / "reports").mkdir(exist_ok=True)
    for f in mine:  # not proflab's: never touched, whatever the limit
        f.write_text("user data")
        os.utime(f, (time.time() - 7200, time.time() - 7200))
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    _cachedir.trim(cache_dir)
    assert not stale.exists() and newer[0] not in _entries(cache_dir)
    assert main(["cache", "--list"]) == 0
    listed = capsys.readouterr().out
    assert old.name in listed and "1 entries" in listed
    assert main(["cache", "--clear"]) == 0
    assert [e for e in _entries(cache_dir) if e.is_dir()] == [] and "removed 1 entries" in capsys.readouterr().out
    assert all(f.read_text() == "user data" for f in mine)
    monkeypatch.setenv("PROFLAB_CACHE_MAX_MB", "0")  # nothing may stay
    load(small)
    assert [e for e in _entries(cache_dir) if e.is_dir()] == []
    assert all(f.read_text() == "user data" for f in mine)


def test_sql_from_the_cache_reads_only_the_tables_it_names(cache_dir, small, monkeypatch):
    from proflab import sql
    from proflab.readers import _cache, load

    load(small)
    read: list[str] = []
    collect = _cache.Entry.collect
    monkeypatch.setattr(_cache.Entry, "collect", lambda self, name, frame=None: read.append(name) or collect(self, name, frame))
    q = "select name, count(*) n, sum(end_ns - start_ns) t from gpu group by name order by t desc, name"
    cached = sql.query_cached(small, q)
    assert read == ["gpu"]
    assert cached.equals(sql.query(load(small, cache=False), q))
    assert sql.query_cached(small, q, cache=False) is None
    # an analysis table is built from the trace's cached tables, all of them
    read.clear()
    k = "select name, count(*) n, sum(dur_ns) t from kernels group by name order by t desc, name"
    assert sql.query_cached(small, k).equals(sql.query(load(small, cache=False), k))
    assert {"cpu", "devices", "gpu", "steps"} <= set(read)


def test_cache_follows_the_file(cache_dir, small):
    """A rewritten trace (new size / mtime) gets a new entry, never the old tables."""
    from proflab.readers import load

    load(small)
    other = KINETO_DIR / "sync_every_step.pt.trace.json.gz"
    if not other.exists():
        pytest.skip("missing sync_every_step trace")
    small.write_bytes(other.read_bytes())
    rewritten, expected = load(small), load(other, cache=False)
    assert rewritten.gpu.equals(expected.gpu) and rewritten.cpu.equals(expected.cpu)
    assert len(_entries(cache_dir)) == 2  # the old entry is not reused


@pytest.mark.parametrize("damage", ["truncate", "garbage", "missing", "schema", "meta"])
def test_corrupt_cache_entry_is_ignored_and_rewritten(cache_dir, small, damage):
    from proflab.readers import _cache, load

    fresh = load(small, cache=False)
    load(small)
    (entry,) = _entries(cache_dir)
    cpu = entry / "cpu.arrow"
    if damage == "truncate":
        cpu.write_bytes(cpu.read_bytes()[: cpu.stat().st_size // 2])
    elif damage == "garbage":
        cpu.write_bytes(b"not arrow at all")
    elif damage == "missing":
        cpu.unlink()
    elif damage == "schema":
        pl.DataFrame({"x": [1]}).write_ipc(cpu)
    else:
        (entry / "meta.json").write_text("{")
    _same(fresh, load(small))  # read again from the trace, no error
    assert _entries(cache_dir) == [entry]  # and the entry written anew
    assert _cache.load_entry(small) is not None


def test_concurrent_writers_leave_one_whole_entry(cache_dir, small):
    """Several processes reading the same uncached trace at once: each gets the trace, and
    the cache holds one entry that loads."""
    code = "import sys; from proflab.readers import load; t = load(sys.argv[1]); print(t.gpu.height, t.cpu.height)"
    env = dict(_env(), PROFLAB_CACHE_DIR=str(cache_dir), PROFLAB_CACHE_MIN_MB="0")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(small)], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(4)]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    from proflab.readers import load

    fresh = load(small, cache=False)
    assert set(outs) == {f"{fresh.gpu.height} {fresh.cpu.height}"}
    assert len(_entries(cache_dir)) == 1
    assert [p.name for p in cache_dir.iterdir()] == [p.name for p in _entries(cache_dir)]
    _same(fresh, load(small))


def test_no_cache_flag_and_env(cache_dir, small, monkeypatch):
    from proflab.cli import main

    assert main(["analyze", str(small), "-f", "json", "-o", str(small.parent / "r.json"), "--no-cache"]) == 0
    assert _entries(cache_dir) == []
    monkeypatch.setenv("PROFLAB_NO_CACHE", "1")
    assert main(["sql", str(small), "select count(*) from gpu", "-f", "csv", "-o", str(small.parent / "r.csv")]) == 0
    assert _entries(cache_dir) == []
    monkeypatch.delenv("PROFLAB_NO_CACHE")
    assert main(["sql", str(small), "select count(*) from gpu", "-f", "csv", "-o", str(small.parent / "r.csv")]) == 0
    assert len(_entries(cache_dir)) == 1


def test_unwritable_cache_folder_is_not_an_error(tmp_path, small, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("PROFLAB_CACHE_DIR", str(blocker / "cache"))  # under a file: cannot exist
    monkeypatch.setenv("PROFLAB_CACHE_MIN_MB", "0")
    from proflab.readers import load

    _same(load(small, cache=False), load(small))


# -- slicing ----------------------------------------------------------------------------------


def test_steps_slice_keeps_the_selected_steps_and_their_launches(small):
    from proflab import load

    whole = load(small, cache=False)
    numbers = whole.steps["step"].to_list()
    assert len(numbers) >= 3
    first = numbers[1]
    part = load(small, cache=False, steps=f"{first}:{first + 1}")
    assert part.steps["step"].to_list() == [first]
    lo, hi = part.steps["start_ns"][0], part.steps["end_ns"][0]
    # host events overlap the step; every GPU activity was launched by a kept host call
    assert ((part.cpu["start_ns"] < hi) & (part.cpu["start_ns"] + part.cpu["dur_ns"] >= lo)).all()
    kept_calls = part.cpu["correlation"].drop_nulls()
    assert part.gpu["correlation"].is_in(kept_calls.implode()).all()
    # and all of them: the step's launches are the whole trace's launches from its calls
    calls = whole.cpu.filter((pl.col("start_ns") >= lo) & (pl.col("start_ns") < hi))["correlation"].drop_nulls()
    assert whole.gpu.filter(pl.col("correlation").is_in(calls.implode())).height <= part.gpu.height
    assert 0 < part.gpu.height < whole.gpu.height
    assert part.meta.notes[-1].startswith(f"analysed part of the trace: steps {first}:{first + 1} (1 of")


def test_window_slice_is_cut_exactly(small):
    from proflab import analyze, load

    whole = load(small, cache=False)
    t0 = min(whole.gpu["start_ns"].min(), whole.cpu["start_ns"].min())
    part = load(small, cache=False, window="50ms:150ms")
    lo, hi = t0 + 50_000_000, t0 + 150_000_000
    for df in (part.gpu, part.cpu):
        assert (df["start_ns"] >= lo).all() and ((df["start_ns"] + df["dur_ns"]) <= hi).all()
    assert ((part.steps["start_ns"] >= lo) & (part.steps["end_ns"] <= hi)).all()
    # busy time inside the window: what the whole trace's kernels cover of it
    r = analyze(part)
    assert r.summary["wall_ms"] <= 100.0 + 1e-6


def test_slice_of_a_cached_trace_equals_slice_of_a_fresh_read(cache_dir, small):
    from proflab import load

    load(small)  # fills the cache
    for kw in ({"steps": "2:4"}, {"window": "20:90"}, {"window": "1ms:"}):
        _same(load(small, **kw), load(small, cache=False, **kw))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "99:120"], "selects no step; its steps are"),
        (["--steps", "7:3"], "selects no step"),
        (["--steps", "x"], "expected FIRST:STOP"),
        (["--window", "10"], "expected START:END"),
        (["--window", "5s:1s"], "END must be after START"),
        (["--window", "9000s:9001s"], "holds no events"),
    ],
)
def test_bad_slices_are_one_line_and_exit_2(small, capsys, args, message):
    from proflab.cli import main

    assert main(["analyze", str(small), "--no-cache", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


# -- progress ---------------------------------------------------------------------------------


def test_read_reports_progress_only_to_an_installed_sink(small, tmp_path, monkeypatch):
    import gzip

    from proflab.readers import _progress, kineto

    plain = tmp_path / "plain.json"
    plain.write_bytes(gzip.decompress(small.read_bytes()))
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 256 * 1024)  # many slices
    monkeypatch.setenv("PROFLAB_READ_PROCESSES", "1")
    seen: list = []
    with _progress.reporting(seen.append):
        kineto.read(plain)
    assert len(seen) > 5 and seen == sorted(seen) and seen[-1] == 1.0
    seen.clear()
    with _progress.reporting(seen.append):
        kineto.read(small)  # gzip: the total is unknown
    assert seen and set(seen) == {None}
    kineto.read(plain)  # no sink: nothing to report to, and no error
    assert _progress._sink is None


def test_cli_shows_no_progress_in_a_pipe(small, tmp_path):
    """On a pipe (as here) stderr gets nothing but errors, whatever the format."""
    r = subprocess.run([sys.executable, "-m", "proflab", "analyze", str(small), "--no-cache"], capture_output=True,
                       text=True, timeout=300, env=_env())
    assert r.returncode == 0 and r.stderr == ""


def test_cli_shows_reading_and_analysing_on_a_terminal(small):
    """With stderr on a terminal, a bar while the trace is read and a spinner while it is
    analysed, both gone when the report prints; the report on stdout is the same as in a pipe."""
    import pty
    import threading

    master, slave = pty.openpty()
    got = bytearray()

    def drain():  # read while the program runs: a full terminal buffer would stop it
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal's other side closed
                return
            if not chunk:
                return
            got.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    cmd = [sys.executable, "-m", "proflab", "analyze", str(small), "--no-cache", "--color", "never"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, env={**_env(), "TERM": "xterm"}) as proc:
        os.close(slave)
        out, _ = proc.communicate(timeout=300)
    reader.join(timeout=60)
    os.close(master)
    piped = subprocess.run(cmd, capture_output=True, timeout=300, env=_env())
    assert proc.returncode == 0 and out == piped.stdout and out
    shown = got.decode("utf-8", "replace")
    assert "reading" in shown and "analysing" in shown, shown[-500:]


from shared_fixtures import NSYS  # noqa: E402

NSYS_EXPORT = NSYS / "h100_2gpu_1s.sqlite"


def test_cache_round_trip_of_an_nsys_export(cache_dir, tmp_path):
    """The cache holds whatever a reader produced: an Nsight Systems export too."""
    if not NSYS_EXPORT.exists():
        pytest.skip("shared nsys fixtures are absent")
    from proflab.readers import load

    p = tmp_path / "export.sqlite"
    p.write_bytes(NSYS_EXPORT.read_bytes())
    fresh = load(p, cache=False)
    load(p)
    assert len(_entries(cache_dir)) == 1
    _same(fresh, load(p))
    assert fresh.gpu.height > 1000 and fresh.cpu.height > 1000  # a round trip of real data


def _compare(*args: str) -> str:
    from proflab.cli import main

    out = Path(args[0]).parent / "cmp.out"
    assert main(["compare", *args, "-o", str(out)]) == 0
    return out.read_text()


@pytest.mark.parametrize("fmt", ["json", "term", "md"])
def test_compare_of_cached_traces_is_the_fresh_one_and_reads_no_trace(cache_dir, small, fmt, monkeypatch):
    """compare keeps each side's report and the small tables it takes from the trace in the
    report cache: a repeated compare reads neither trace and prints exactly what a fresh one
    printed; other options are other entries."""
    other = small.parent / "sync.pt.trace.json.gz"
    other.write_bytes((KINETO_DIR / "sync_every_step.pt.trace.json.gz").read_bytes())
    fresh = _compare(str(small), str(other), "-f", fmt, "--no-cache")
    assert not (cache_dir / "reports").exists()
    first = _compare(str(small), str(other), "-f", fmt)
    assert len(list((cache_dir / "reports").iterdir())) == 2  # one per side
    import proflab.readers

    def no_read(*a, **k):
        raise AssertionError("a cached side was read")

    with monkeypatch.context() as m:
        m.setattr(proflab.readers, "load", no_read)
        again = _compare(str(small), str(other), "-f", fmt)
    assert fresh == first == again
    top3 = _compare(str(small), str(other), "-f", fmt, "--top", "3")
    assert top3 == _compare(str(small), str(other), "-f", fmt, "--top", "3", "--no-cache")
    steps = _compare(str(small), str(other), "-f", fmt, "--window", "0ms:40ms")
    assert steps == _compare(str(small), str(other), "-f", fmt, "--window", "0ms:40ms", "--no-cache") != fresh
    # a damaged entry is analysed again and replaced
    for f in (cache_dir / "reports").iterdir():
        d = json.loads(f.read_text())
        if "extra" in d:
            d["extra"]["frames"]["kernels"] = "not base64 IPC"
            f.write_text(json.dumps(d))
    assert _compare(str(small), str(other), "-f", fmt) == fresh


def test_compare_parts_round_trip_exactly(small):
    """The tables a comparison keeps per trace come back with the same types and values."""
    from proflab.analysis import Context
    from proflab.report.compare import PART_FRAMES, decode_part, encode_part, trace_part
    from proflab.readers import load

    part = trace_part(Context(load(small, cache=False)))
    back = decode_part(json.loads(json.dumps(encode_part(part))))
    for name in PART_FRAMES:
        a, b = getattr(part, name), getattr(back, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.schema == b.schema and a.equals(b), name
    assert (back.gpu_steps, back.with_stack, back.record_shapes) == (part.gpu_steps, part.with_stack, part.record_shapes)
    assert part.kernels.height and part.steps is not None and part.steps.height


_SQL_QUERIES = [
    "select count(*) from gpu",
    "select name, count(*) n, sum(dur_ns) t, avg(dur_ns) / 1e3 us, max(is_comm) c from gpu group by name order by t desc, name",
    "select cat, count(*), sum(end_ns - start_ns) from cpu group by cat order by 1",
    "select * from steps order by step",
    "select name, input_types, external_id from cpu where cat = 'cpu_op' order by start_ns, name limit 70",
    "select * from devices",
    "select * from gpu where dur_ns < 0",  # no rows
    "select kind, copy_kind, bytes / 3 as third from gpu where kind != 'kernel' order by start_ns limit 5",
]


def _sql(*args: str) -> str:
    from proflab.cli import main

    out = Path(args[0]).parent / "sql.out"
    assert main(["sql", *args, "-o", str(out), *(() if "-f" in args else ("-f", "table"))]) == 0
    return out.read_text()


def test_sql_of_a_cached_trace_needs_no_polars_and_prints_the_same(cache_dir, small):
    """The first query of a cached trace keeps the tables it read as DuckDB files in the
    cache entry; later queries of them run on DuckDB alone (no polars, no numpy) and print
    exactly what the polars path prints."""
    from proflab import _sqlfast
    from proflab.readers import load

    load(small)  # the table cache entry
    fresh = {q: _sql(str(small), q, "--no-cache") for q in _SQL_QUERIES}
    assert all(_sqlfast.cached_result(small, q) is None for q in _SQL_QUERIES)  # nothing kept yet
    assert {q: _sql(str(small), q) for q in _SQL_QUERIES} == fresh  # polars path; keeps the tables
    (entry,) = _entries(cache_dir)
    assert sorted(p.name.split(".")[0] for p in entry.glob("sql-*.duckdb")) == ["sql-cpu", "sql-devices", "sql-gpu", "sql-steps"]
    for q in _SQL_QUERIES:
        assert _sqlfast.cached_result(small, q) is not None, q
        assert _sql(str(small), q) == fresh[q], q
    assert _sql(str(small), _SQL_QUERIES[1], "--limit", "3") == _sql(str(small), _SQL_QUERIES[1], "--limit", "3", "--no-cache")
    code = ("import sys; from proflab.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, 'polars' in sys.modules, 'numpy' in sys.modules)")
    env = dict(_env(), PROFLAB_CACHE_DIR=str(cache_dir), PROFLAB_CACHE_MIN_MB="0")
    r = subprocess.run([sys.executable, "-c", code, "sql", str(small), _SQL_QUERIES[1], "-o", str(small.parent / "s.txt"), "-f", "table"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.stdout.split() == ["0", "False", "False"], r.stderr
    # nothing on stderr but the line that says where the output went
    assert r.stderr.startswith(f"proflab: wrote {small.parent / 's.txt'} (") and r.stderr.count("\n") == 1, r.stderr
    assert (small.parent / "s.txt").read_text() == fresh[_SQL_QUERIES[1]]
    # a table not kept yet, or another format: the polars path, same answer
    assert _sqlfast.cached_result(small, "select count(*) from kernels") is None
    assert _sql(str(small), "select count(*) n from gpu", "-f", "csv") == "n\n" + fresh[_SQL_QUERIES[0]].split()[2] + "\n"
    # a damaged file: the polars path answers
    for f in entry.glob("sql-gpu.*.duckdb"):
        f.write_bytes(b"not a database")
    assert _sqlfast.cached_result(small, _SQL_QUERIES[0]) is None
    assert _sql(str(small), _SQL_QUERIES[0]) == fresh[_SQL_QUERIES[0]]


_DERIVED_QUERIES = [
    "select name, count(*) n, sum(dur_ns) t, min(launch_name) l from kernels group by name order by t desc, name",
    "select cause, count(*), sum(dur_ns) from gaps group by cause order by 1",
    "select * from step_breakdown order by step, device",
    "select name, count, total_ns, share_pct, op from hot_kernels order by total_ns desc, name limit 20",
    "select name, count(*) from ranges group by name order by 2 desc, 1 limit 20",
    "select * from memcpy_summary order by 1, 2",
]


def test_sql_of_an_analysis_table_is_kept_after_its_first_query(cache_dir, small, monkeypatch):
    """The analysis tables (kernels, gaps, ranges...) are built once from the cached trace,
    then kept in the cache entry as the trace's own are: later queries run on DuckDB alone
    and print what a fresh read prints. They are kept under a hash of the whole package, so
    a changed analysis does not serve the old table."""
    from proflab import _sqlfast
    from proflab.readers import _cachedir, load

    load(small)
    fresh = {q: _sql(str(small), q, "--no-cache") for q in _DERIVED_QUERIES}
    assert all(_sqlfast.cached_result(small, q) is None for q in _DERIVED_QUERIES)
    assert {q: _sql(str(small), q) for q in _DERIVED_QUERIES} == fresh  # polars path; keeps the tables
    (entry,) = _entries(cache_dir)
    kept = sorted(p.name.split(".")[0] for p in entry.glob("sql-*.duckdb"))
    assert kept == ["sql-gaps", "sql-hot_kernels", "sql-kernels", "sql-memcpy_summary", "sql-ranges", "sql-step_breakdown"]
    for q in _DERIVED_QUERIES:
        assert _sqlfast.cached_result(small, q) is not None, q
        assert _sql(str(small), q) == fresh[q], q
    monkeypatch.setattr(_cachedir, "analysis_version", lambda: "0" * 64)  # another analysis
    assert all(_sqlfast.cached_result(small, q) is None for q in _DERIVED_QUERIES)


def test_sql_from_the_kept_tables_cannot_reach_outside(cache_dir, small, tmp_path, monkeypatch):
    """The database the kept tables are attached to is locked as proflab.sql's own: every way
    out that tests/test_hardening.py tries is refused there too (each query names a table of
    the trace, so that it takes this path)."""
    from test_hardening import _SQL_WAYS_OUT

    from proflab import _sqlfast
    from proflab.errors import QueryError
    from proflab.readers import load
    from proflab.sql import query_cached

    load(small)
    query_cached(small, "select count(*) from gpu, cpu, steps, devices")  # keeps the four tables
    monkeypatch.chdir(tmp_path)
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    ways = [*_SQL_WAYS_OUT, "INSERT INTO _proflab_gpu.gpu SELECT * FROM gpu", "DETACH _proflab_gpu; ATTACH '{d}/x.db' AS y",
            "CREATE TABLE _proflab_gpu.gpu2 AS SELECT 1"]
    refused = 0
    for template in ways:
        before = sorted(p.name for p in tmp_path.iterdir())
        try:
            # None: not this path's to answer (a catalog word, a result type it does not serve,
            # decided before anything runs); the polars path then refuses it (test_hardening)
            assert _sqlfast.cached_result(small, template.format(f=secret, d=tmp_path) + "\n-- gpu") is None, template
        except QueryError as e:
            assert "\n" not in str(e)
            refused += 1
        assert sorted(p.name for p in tmp_path.iterdir()) == before, "the query wrote a file"
    assert refused >= len(ways) - 3  # (sniff_csv's result type, a COPY naming kernels, PRAGMA)


def test_report_page_of_a_cached_trace_is_the_fresh_one_and_reads_no_trace(cache_dir, small, monkeypatch):
    """report keeps the page's report and timeline of one trace in the report cache: a
    repeated report reads no trace and writes the same page."""
    from proflab.cli import main

    pages = {}
    for name, extra in (("fresh", ["--no-cache"]), ("first", []), ("again", [])):
        out = small.parent / f"{name}.html"
        if name == "again":
            import proflab.readers

            monkeypatch.setattr(proflab.readers, "load", lambda *a, **k: (_ for _ in ()).throw(AssertionError("read")))
        assert main(["report", str(small), "-o", str(out), *extra]) == 0
        # (each page has its own random nonce for its scripts)
        pages[name] = re.sub(r"nonce-[A-Za-z0-9_-]+|nonce=\"[A-Za-z0-9_-]+\"", "NONCE", out.read_text())
    assert pages["fresh"] == pages["first"] == pages["again"]
    assert pages["fresh"].count("NONCE") >= 2
    assert len(list((cache_dir / "reports").iterdir())) == 1


_FREED_ARRAY = """
import ctypes, sys
import numpy as np
from proflab.cli._process import map_large_blocks
# glibc raises its mapping threshold by itself each time it frees a mapped block (a 30 MiB
# array freed: 30 MiB), and its heap-trim threshold to twice that; both are set here to where
# a long analysis leaves them, so the test does not hang on this process's allocation history
libc = ctypes.CDLL(None)
libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD
if sys.argv[1] == "fixed":
    map_large_blocks()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
base = rss()
b = np.ones(20 << 20, np.uint8)  # a 20 MiB array, freed
del b
print(rss() - base)
"""


_HEAP_RELEASE = """
import numpy as np
from proflab import _heap
_heap.fix_threshold()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
base = rss()
chunks = [np.ones(4 << 20, np.uint8) for _ in range(20)]  # below the threshold: from the heap
top = np.ones(1 << 16, np.uint8)  # live above them: the heap's top cannot shrink past it
del chunks
kept = rss() - base
_heap.release()
print(kept, rss() - base)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings: Linux only")
def test_a_built_table_gives_the_heaps_freed_arrays_back(tmp_path):
    """Arrays under the fixed threshold come from the heap and stay there when freed (reused
    without new pages while a table is built); ``release``, run as each table is done, gives
    them back."""
    script = tmp_path / "release.py"
    script.write_text(_HEAP_RELEASE)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=_env(), check=True)
    kept, after = map(int, out.stdout.split())
    assert kept >= 60  # 80 MiB freed, held by the heap
    assert after <= 4


_REMADE = """
import resource
import numpy as np
from proflab import _heap
_heap.fix_threshold()
keep = np.ones(1 << 16, np.uint8)  # (the heap's first pages in use)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
np.ones(1 << 20, np.uint8).sum()  # once, to fault the pages the loop reuses
before = faults()
for _ in range(200):  # a 1 MiB temporary made and freed again and again, as a replay's plans are
    np.ones(1 << 20, np.uint8).sum()
print(faults() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings: Linux only")
def test_a_temporary_made_again_and_again_reuses_the_heaps_pages(tmp_path):
    """With the mapping threshold fixed, glibc no longer raises its trim threshold: each free of
    a 1 MiB array gave its pages back and the next one faulted 256 in anew (51 k faults for the
    loop's 200). The heap keeps that much free top now: the loop faults (almost) nothing."""
    script = tmp_path / "remade.py"
    script.write_text(_REMADE)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=_env(), check=True)
    assert int(out.stdout) < 2_000


_SLICES_REUSED = """
import numpy as np
from proflab import _heap
_heap.fix_threshold()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
def kept():  # what a freed 16 MiB block leaves in the process
    base = rss()
    b = np.ones(16 << 20, np.uint8)
    del b
    return rss() - base
try:
    with _heap.slices_reused():
        inside = kept()
        raise KeyError  # a read that fails
except KeyError:
    pass
print(inside, kept())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings: Linux only")
def test_slices_reuse_the_heap_while_read_and_give_it_back(tmp_path):
    """While a trace's slices are read, a freed 16 MiB block stays in the heap for the next
    slice; after the read, failed or not, the threshold is fixed again (a freed block leaves)
    and the heap's free memory is given back."""
    script = tmp_path / "slices.py"
    script.write_text(_SLICES_REUSED)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=_env(), check=True)
    inside, after = map(int, out.stdout.split())
    assert inside >= 12 and after <= 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings: Linux only")
def test_analysis_commands_give_freed_arrays_back_to_the_system(tmp_path):
    """numpy's arrays come from glibc's malloc, which keeps a freed array in its heap once it
    has raised its mapping threshold (every array of an analysis at its largest, held to the
    end): the analysis commands fix the threshold, so a freed 20 MiB array leaves the process."""
    script = tmp_path / "freed.py"
    script.write_text(_FREED_ARRAY)
    kept = {how: int(subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=120,
                                    env=_env(), check=True).stdout) for how in ("raised", "fixed")}  # fmt: skip
    assert kept["raised"] >= 15  # the heap keeps it: what the setting is for
    assert kept["fixed"] <= 2


@pytest.fixture(scope="module")
def realistic_large(tmp_path_factory) -> Path:
    """A 0.5 GB realistic trace: its whole analysis peaks near 420 MB (both processes)."""
    out = _generated(tmp_path_factory, 500)
    yield out
    out.unlink()


def test_a_kineto_trace_over_the_memory_budget_is_analysed_within_it(realistic_large, tmp_path):
    """``--memory-budget 250M`` on the 0.5 GB trace, whose whole analysis is estimated (and
    measured: 417 MiB in README's table) to need more: the slices are decoded to disk one at
    a time, the middle steps that fit are read back, and the peak (the largest of proflab and
    any helper, as ``RUSAGE_CHILDREN`` keeps it) stays within the budget."""
    from proflab.readers import budget as limits

    budget = 250 * MB
    assert limits.kineto_need(realistic_large) > 1.5 * budget
    out = tmp_path / "report.json"
    rc, peak, err = analyze_peak(realistic_large, out, "--memory-budget", "250M")
    assert rc in (0, 1), err
    assert peak <= budget, f"peak RSS {peak / MB:.0f} MB over the 250 MB budget"
    report = json.loads(out.read_text())
    source = report["source"]["inputs"][0]
    assert source["memory_budget_bytes"] == budget and 0 < source["analysed_events"] < 0.5 * source["events"]
    notes = [n for n in report["notes"] if n.startswith("memory budget: ")]
    assert len(notes) == 3 and "analysed profiler steps " in notes[0] and "NOT like" not in " ".join(notes[1:])
    assert report["findings"] and report["steps"]


def test_every_event_of_a_kineto_trace_over_the_budget_is_analysed_within_it(realistic_large, tmp_path):
    """``--all-parts --memory-budget 250M`` on the 0.5 GB trace: decoded to disk once, every
    step read back part by part, the peak (both processes) within the budget, and every step
    of the trace in the report."""
    out = tmp_path / "report.json"
    rc, peak, err = analyze_peak(realistic_large, out, "--all-parts", "--memory-budget", "250M")
    assert rc in (0, 1), err
    assert peak <= 250 * MB, f"peak RSS {peak / MB:.0f} MB over the 250 MB budget"
    report = json.loads(out.read_text())
    assert report["source"]["inputs"][0]["parts"] >= 2
    numbers = sorted({s["step"] for s in report["steps"]})
    assert report["summary"]["step_count"] == len(numbers) == numbers[-1] - numbers[0] + 1 > 10  # every step, once
    said = [n for n in report["notes"] if n.startswith("memory budget: analysed every event in ")]
    assert len(said) == 1 and f"(steps {numbers[0]}:" in said[0]
