"""Hardening beyond the readers: `proflab sql` stays inside its tables, concurrent runs never
share a run directory, and `-o` never leaves a half-written file or a traceback."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proflab.cli import main
from proflab.collect.rundir import new_run_dir
from proflab.errors import QueryError

DATA = Path(__file__).resolve().parent / "data" / "kineto"
SMALL = DATA / "pageable_h2d.pt.trace.json.gz"
LARGE = DATA / "train_loop.pt.trace.json.gz"


def _need(p: Path) -> Path:
    if not p.is_file():
        pytest.skip(f"{p.name} is not in tests/data/kineto/")
    return p


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("proflab: error: "), err
    return lines[0]


# --- proflab sql: no files, no extensions, no network, whatever the query ----------------------

_SQL_WAYS_OUT = [
    "SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')",
    "SELECT * FROM read_parquet('https://example.invalid/x.parquet')",
    "SELECT * FROM read_json_auto('s3://bucket/x.json')",
    "SELECT * FROM read_blob('{f}')",
    "SELECT * FROM read_text('{d}/*')",
    "SELECT * FROM sniff_csv('{f}')",
    "SELECT * FROM parquet_metadata('{f}')",
    "SELECT * FROM '{f}'",
    "COPY (SELECT * FROM kernels) TO '{d}/out.csv'",
    "COPY gpu TO '{d}/out.json' (FORMAT json)",
    "EXPORT DATABASE '{d}/exported'",
    "ATTACH '{d}/new.db' AS x",
    "ATTACH 'sqlite:{d}/new.sqlite' AS x (TYPE sqlite)",
    "INSTALL httpfs",
    "FORCE INSTALL json",
    "LOAD httpfs",
    "LOAD '{d}/evil.duckdb_extension'",
    "CREATE SECRET s (TYPE S3, KEY_ID 'a', SECRET 'b')",
    "CREATE PERSISTENT SECRET s (TYPE S3, KEY_ID 'a', SECRET 'b')",
    "SET enable_external_access = true",
    "SET allow_community_extensions = true",
    "SET allow_unsigned_extensions = true",
    "SET extension_directory = '{d}'",
    "SET temp_directory = '{d}'",
    "SET home_directory = '{d}'",
    "SET profiling_output = '{d}/profile.json'",
    "PRAGMA enable_profiling = 'json'",
    "SET python_enable_replacements = true",
    "SET lock_configuration = false",
    "RESET lock_configuration",
    # DuckDB's Python client can scan a Python variable named in the query: never here
    "SELECT * FROM frames",
    "SELECT * FROM df",
    "SELECT * FROM os",
    "SELECT 1; COPY (SELECT 1) TO '{d}/second.csv'",
]


@pytest.fixture(scope="module")
def small_trace():
    from proflab import load

    return load(_need(SMALL), cache=False)


@pytest.mark.parametrize("template", _SQL_WAYS_OUT)
def test_sql_cannot_reach_outside(small_trace, template, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    from proflab.sql import query

    with pytest.raises(QueryError) as e:
        query(small_trace, template.format(f=secret, d=tmp_path))
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "the query wrote a file"


def test_sql_cli_refusal_is_one_line(tmp_path, capsys):
    rc = main(["sql", str(_need(SMALL)), f"COPY gpu TO '{tmp_path}/x.csv'", "--no-cache"])
    assert rc == 2
    _one_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


# --- run directories: two runs started in the same second never share one ----------------------


def _make(args) -> str:
    root, now = args
    return str(new_run_dir(root, "same", now=now))


def test_run_dirs_made_in_the_same_second_are_distinct(tmp_path):
    now = time.time()
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        made = pool.map(_make, [(str(tmp_path), now)] * 16)
    assert len(set(made)) == 16, made
    assert all(Path(p).is_dir() for p in made)


def test_two_proflab_runs_at_once_get_their_own_directories(tmp_path):
    """Two real `proflab run` processes, same name, started together (a program without
    torch: only the run directory, meta.json and the exit status are recorded)."""
    cmd = [sys.executable, "-m", "proflab", "run", "--no-monitor", "--name", "twin", "-o", str(tmp_path / "runs"),
           "--", sys.executable, "-c", "print('hello')"]
    env = {**os.environ, "PROFLAB_NO_CACHE": "1"}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    dirs = sorted((tmp_path / "runs").iterdir())
    assert len(dirs) == 2, dirs
    metas = [json.loads((d / "meta.json").read_text()) for d in dirs]
    assert all(m.get("status") for m in metas)


# --- -o: never half a file, never a traceback ----------------------------------------------------


@pytest.mark.parametrize(
    "target",
    ["{d}", "/proc/proflab-out.json", "{d}/" + "x" * 300 + ".json", "/sys/proflab/out.md"],
    ids=["a-directory", "no-permission", "name-too-long", "unwritable-tree"],
)
@pytest.mark.parametrize("command", ["analyze", "sql"])
def test_unwritable_output_is_one_line(command, target, tmp_path, capsys):
    target = target.format(d=tmp_path)
    argv = ["analyze", str(_need(SMALL)), "--no-cache", "-o", target, "-f", "json"]
    if command == "sql":
        argv = ["sql", str(SMALL), "SELECT name FROM kernels", "--no-cache", "-o", target, "-f", "csv"]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert "Traceback" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("command", ["analyze", "sql", "kernels"])
def test_failed_command_leaves_the_old_output(command, tmp_path, capsys):
    bad = tmp_path / "bad.pt.trace.json"
    bad.write_text('{"traceEvents": [')
    out = tmp_path / "out.json"
    out.write_text("old")
    argv = {
        "analyze": ["analyze", str(bad), "-o", str(out)],
        "sql": ["sql", str(bad), "SELECT 1", "-o", str(out)],
        "kernels": ["kernels", "--import", str(bad), "-o", str(out)],
    }[command]
    assert main(argv) == 2
    _one_line(capsys.readouterr().err)
    assert out.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pt.trace.json", "out.json"]


def test_killed_writer_never_leaves_half_a_report(tmp_path):
    """SIGKILL at staggered moments of `proflab analyze -o`: the target is always the old
    report or a whole new one (a killed run may leave its hidden temporary, never a torn target)."""
    trace = _need(LARGE)
    out = tmp_path / "report.json"
    out.write_text('{"old": true}')
    env = {**os.environ, "PROFLAB_NO_CACHE": "1", "PROFLAB_READ_PROCESSES": "1"}
    cmd = [sys.executable, "-m", "proflab", "analyze", str(trace), "-o", str(out)]
    whole = 0
    for delay in (0.3, 0.8, 1.3, 1.8, 2.5, 3.5, 5.0):
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            p.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        doc = json.loads(out.read_text())  # raises on a torn file
        whole += "schema" in doc or isinstance(doc, list)
        for leftover in tmp_path.glob(".report.json.*.tmp"):
            leftover.unlink()
    p = subprocess.run(cmd, capture_output=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(out.read_text()) != {"old": True}


# --- text from traces and run directories reaches no terminal raw --------------------------------

_ESCAPES = ("\x1b]0;owned\x07", "\x1b[2J", "\x9b31m", "\u202e")


def _no_controls(text: str) -> None:
    for seq in _ESCAPES:
        assert seq not in text, f"{seq!r} reached the output"
    assert "\x1b" not in text and "\x07" not in text


def test_sql_table_shows_escapes_in_names(tmp_path, capsys):
    import gzip

    doc = json.loads(gzip.decompress(_need(SMALL).read_bytes()))
    for i, e in enumerate(ev for ev in doc["traceEvents"] if ev.get("cat") == "kernel"):
        e["name"] = _ESCAPES[i % len(_ESCAPES)] + "kernel"
    p = tmp_path / "hostile.pt.trace.json"
    p.write_text(json.dumps(doc))
    assert main(["sql", str(p), 'SELECT name, name AS "\x1b[31mcol" FROM kernels', "--no-cache"]) == 0
    out = capsys.readouterr().out
    _no_controls(out)
    assert "\\x1b]0;owned\\x07kernel" in out, out


def test_runs_listing_shows_escapes_in_names(tmp_path, capsys):
    src = Path(__file__).resolve().parent / "data" / "runs" / "20261122-074634-h100_cuda_train"
    if not src.is_dir():
        pytest.skip("tests/data/runs/ has no recorded run")
    import shutil

    run = tmp_path / "runs" / src.name
    shutil.copytree(src, run)
    meta = json.loads((run / "meta.json").read_text())
    meta["name"], meta["command"] = "\x1b[2Jname", ["python", "\x1b]0;owned\x07train.py"]
    (run / "meta.json").write_text(json.dumps(meta))
    assert main(["runs", str(tmp_path / "runs"), "--width", "200"]) == 0
    out = capsys.readouterr().out
    _no_controls(out)
    assert "\\x1b[2Jname" in out


def test_error_line_shows_escapes_in_a_file_name(tmp_path, capsys):
    p = tmp_path / "bad\x1b[31m\nname.json"
    p.write_text("{")
    assert main(["analyze", str(p)]) == 2
    err = capsys.readouterr().err
    _no_controls(err)
    assert len(err.strip().splitlines()) == 1, err


# --- a damaged clock: one event decades away from the rest ---------------------------------------


def _gemm_doc() -> dict:
    import gzip

    return json.loads(gzip.decompress(_need(DATA / "healthy_bf16_gemm.pt.trace.json.gz").read_bytes()))


def test_events_at_time_zero_cost_no_more_than_the_rest(tmp_path):
    """Fuzz case kineto_json-2199: a real H100 trace (timestamps ~4.5e15 ns) whose events lost
    their ts (read as 0). The window is 51 days long, and cutting it into 100 ms buckets
    took 13 s and 2.7 GiB before the bucket count was bounded."""
    import resource

    from fuzzing import Builder
    from proflab import analyze, load

    if not (DATA / "healthy_bf16_gemm.pt.trace.json.gz").is_file():
        pytest.skip("healthy_bf16_gemm is not in tests/data/kineto/")
    case = Builder(tmp_path).build("kineto_json", 2199)
    assert case.what.endswith("no ts"), case.what
    t0, rss0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report = analyze(load(case.paths[0], cache=False))
    assert time.perf_counter() - t0 < 10.0
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) < (500 << 10)  # KiB
    assert report.summary["wall_ms"] > 0


def test_centuries_long_event_is_a_refusal_naming_the_file(tmp_path, capsys):
    doc = _gemm_doc()
    next(e for e in doc["traceEvents"] if e.get("cat") == "cpu_op")["dur"] = 2**53 + 1
    p = tmp_path / "long.pt.trace.json"
    p.write_text(json.dumps(doc))
    rc = main(["analyze", str(p), "--no-cache"])
    if rc == 0:  # read and analysed soundly is as good as a refusal
        return
    assert rc == 2
    assert str(p) in _one_line(capsys.readouterr().err)


# --- cases a 16,000-case fuzz run found (PROFLAB_FUZZ_CASES=16000), rebuilt by their ids ----------


def _fuzz_case(tmp_path, family: str, index: int, what: str):
    from fuzzing import FIXTURES, Builder

    builder = Builder(tmp_path)
    if (why := builder.available(family)) is not None:
        pytest.skip(why)
    try:
        case = builder.build(family, index)
    except FileNotFoundError as e:  # a seed input that is not shipped here
        pytest.skip(str(e))
    if not case.what.startswith(what) and not FIXTURES.is_dir():
        # a case's id picks among the seeds, and the shared fixtures' are some of them
        pytest.skip(f"case {family}-{index} is another input without the shared fixtures ({FIXTURES})")
    assert case.what.startswith(what), case.what  # the generator still builds this case
    return case


@pytest.mark.parametrize(("family", "index", "what"), [
    ("kineto_json", 736, "memory_h100: event.ts=9223372036854775808"),
    ("kineto_json", 2233, "memory_h100: 30 events duplicated+ts=1e+300"),
    ("chrome_array", 1434, "memory_h100 as an array"),
])  # fmt: skip
def test_memory_events_out_of_range_are_dropped_and_said(tmp_path, family, index, what):
    """A [memory] event whose time or size no int64 column holds was a TypeError (an
    OverflowError for 1e300) where the report's memory section was built."""
    from proflab import analyze, load

    report = analyze(load(_fuzz_case(tmp_path, family, index, what).paths[0], cache=False))
    assert report.memory is not None and report.memory["devices"], report.memory
    assert any("[memory] event(s)" in n and "dropped" in n for n in report.memory["notes"]), report.memory["notes"]


def test_memory_reader_keeps_in_range_events_and_counts_the_rest(tmp_path):
    from proflab.readers.memory import kineto_memory

    def ev(ts, **args):
        return {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts, "args": args}

    ok = {"Bytes": 512, "Total Allocated": 512, "Total Reserved": 2048, "Device Id": 0, "Device Type": 1, "Addr": 7}
    doc = {"traceEvents": [
        ev(10.0, **ok), ev(1e300, **ok), ev(11.0, **{**ok, "Bytes": 2**64}), ev(12.0, **{**ok, "Device Id": 2**40}),
        ev(13.0, **{**ok, "Addr": -(2**63) - 1}), ev(14.0, **{k: v for k, v in ok.items() if k != "Bytes"}), ev(15.0, **ok),
    ]}  # fmt: skip
    p = tmp_path / "m.pt.trace.json"
    p.write_text(json.dumps(doc))
    df, _, dropped = kineto_memory(p)
    assert df["ts_ns"].to_list() == [10_000, 15_000] and df["bytes"].to_list() == [512, 512]
    assert dropped == 5


def test_sqlite_error_text_reaches_no_terminal_raw(tmp_path, capsys):
    """nsys-1155: a flipped bit in a table's CREATE statement; SQLite's error quotes the bad
    token (\\x0e) in the message, which went out raw through the API."""
    from proflab import load
    from proflab.errors import CorruptInput

    case = _fuzz_case(tmp_path, "nsys", 1155, "mfu_2gpu_before: bit_flips")
    with pytest.raises(CorruptInput) as e:
        load(case.paths[0], cache=False)
    assert "\\x0e" in str(e.value) and "\x0e" not in str(e.value)
    assert main(["analyze", str(case.paths[0]), "--no-cache"]) == 2
    _no_controls(_one_line(capsys.readouterr().err))


def test_error_message_of_the_api_is_one_escaped_line():
    from proflab.errors import CorruptInput

    e = CorruptInput("a\x1b[2Jb\nc.json", "token \x1b]0;owned\x07\nnext\u202e")
    assert "\n" not in str(e) and "\x1b" not in str(e) and "\u202e" not in str(e)
    assert str(e) == "a\\x1b[2Jb\\x0ac.json: token \\x1b]0;owned\\x07\\x0anext\\u202e"


def test_names_that_are_not_utf8_are_shown_repaired(tmp_path):
    """nsys-1192: a flipped bit made one NVTX text invalid UTF-8; kept as read, it stopped the
    process with a panic inside polars (PyObject pointer is null) when the ranges were listed."""
    from proflab import analyze, load

    trace = load(_fuzz_case(tmp_path, "nsys", 1192, "mfu_2gpu_after: bit_flips").paths[0], cache=False)
    assert any("not UTF-8" in n for n in trace.meta.notes), trace.meta.notes
    assert trace.cpu["name"].str.contains("\ufffd", literal=True).any()
    report = analyze(trace)
    assert report.ranges and report.kernels


def test_meta_json_of_another_shape_is_ignored_where_memory_is_costed(tmp_path):
    """rundir-534: a run directory whose meta.json holds a number where proflab writes an
    object; the memory section's collection cost called .get on it."""
    case = _fuzz_case(tmp_path, "rundir", 534, "20261122-074634-h100_cuda_train: meta.json: a wrong field")
    assert main(["analyze", str(case.paths[0]), "-f", "json", "--no-cache"]) == 0
    from proflab.analysis.memory import MemoryAnalysis, _run_collection_cost

    for meta in (5, [], {"options": 3}, {"options": {"profile_memory": True}, "processes": [4, {"step_times": "x"},
                 {"step_times": {"bare_ms": "1", "profiled_ms": float("nan")}}]}):  # fmt: skip
        run = tmp_path / f"run{abs(hash(json.dumps(meta, default=str)))}"
        run.mkdir()
        (run / "meta.json").write_text(json.dumps(meta))
        a = MemoryAnalysis(sources={})
        _run_collection_cost(a, run)
        assert "run_profiled_step_ms" not in (a.collection or {})


def test_a_duration_whose_end_leaves_the_clock_is_dropped_and_said(tmp_path):
    """kineto_json-6378: dur 2**53+1 us on a trace whose starts are epoch ns: start and
    duration each fit in int64 ns, their sum wrapped, and the report said wall_ms = -9.4e12."""
    from proflab import analyze, load

    trace = load(_fuzz_case(tmp_path, "kineto_json", 6378, "a100_2022: event.dur=9007199254740993").paths[0], cache=False)
    assert any("clock's range" in n for n in trace.meta.notes), trace.meta.notes
    report = analyze(trace)
    assert report.summary["wall_ms"] >= 0 and all(s.get("dur_ms", 0) >= 0 for s in report.steps)


def test_a_blob_where_an_export_keeps_text_is_read_as_text(tmp_path):
    """nsys-2718: a StringIds value stored as a BLOB that is not UTF-8 stopped the read with
    polars' "invalid utf8" (a ComputeError, traceback and all)."""
    from proflab import analyze, load

    trace = load(_fuzz_case(tmp_path, "nsys", 2718, "t4_power_iteration_baseline: StringIds.value=X'00FF10'").paths[0], cache=False)
    analyze(trace)
    assert any("not UTF-8" in n for n in trace.meta.notes), trace.meta.notes


def test_a_monitor_file_that_makes_polars_panic_is_one_line(tmp_path, capsys):
    """rundir-1485: a zeroed block in monitor.parquet made polars panic (PanicException, which
    ``except Exception`` does not catch) where the memory section read it."""
    case = _fuzz_case(tmp_path, "rundir", 1485, "20261122-074634-h100_cuda_train: monitor.parquet zero_block")
    from proflab.errors import CorruptInput
    from proflab.readers.monitor import read_monitor

    with pytest.raises(CorruptInput, match="monitor.parquet: not a readable parquet file"):
        read_monitor(case.paths[0] / "monitor.parquet")
    assert main(["analyze", str(case.paths[0]), "-f", "json", "--no-cache"]) in (0, 2)
    assert "Traceback" not in capsys.readouterr().err


def test_an_ncu_speedup_beyond_the_whole_kernel_is_not_read(tmp_path):
    """ncu-5181: "1,234.5" in a details page's Estimated Speedup became a 1,234.5 % speedup."""
    from proflab.readers import ncu as ncu_reader

    case = _fuzz_case(tmp_path, "ncu", 5181, "copy_blocked details.csv: bad cells")
    speeds = ncu_reader.read(case.paths[0]).rules.get_column("est_speedup_pct").to_list()
    assert speeds and all(s is None or 0 <= s <= 100 for s in speeds), speeds
    assert None in speeds  # the damaged cell, read as missing


def test_a_far_rowid_does_not_split_a_table_into_trillions_of_pieces(tmp_path):
    """nsys-6296: a StringIds id (its rowid) of -2**63 made the read plan 3.5e13 rowid pieces
    of the table; the list of their queries took the test process to 24 GB and the OOM
    killer. Run in a child with its address space capped, so a regression cannot do that."""
    import resource

    case = _fuzz_case(tmp_path, "nsys", 6296, "h100_2gpu_1s: StringIds.id=-9223372036854775808")

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    proc = subprocess.run([sys.executable, "-m", "proflab", "analyze", str(case.paths[0]), "-f", "json", "--no-cache"],
                          capture_output=True, text=True, preexec_fn=cap, timeout=300)  # fmt: skip
    assert proc.returncode in (0, 2), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr


@pytest.mark.parametrize(("family", "index", "what"), [
    ("kineto_json", 11853, "a100_2022: args.shared memory=-1"),
    ("kineto_json", 15861, "a100_2022: hostile names+args.shared memory=-1"),
])  # fmt: skip
def test_a_negative_size_reads_as_missing(tmp_path, family, index, what):
    """Fuzz cases 11853 and 15861: "shared memory": -1 became a kernel row with -1 bytes of
    shared memory in the report; sizes and launch dimensions below 0 now read as missing."""
    from proflab import analyze, load

    trace = load(_fuzz_case(tmp_path, family, index, what).paths[0], cache=False)
    for c in ("bytes", "grid_x", "block_x", "registers", "shared_mem_bytes"):
        assert not (trace.gpu[c] < 0).any(), c
    assert all((k.get("shared_mem_bytes") or 0) >= 0 for k in analyze(trace).kernels)


def test_a_memory_event_a_millennium_away_is_dropped(tmp_path):
    """memory case kineto_json-15158: ts = 1e308 us is finite, but not in ns (OverflowError)."""
    from proflab import analyze, load

    report = analyze(load(_fuzz_case(tmp_path, "kineto_json", 15158, "memory_h100: event.ts=1e+308").paths[0], cache=False))
    assert any("dropped" in n for n in report.memory["notes"]), report.memory["notes"]


def test_a_run_listing_holds_numbers_no_column_can(tmp_path, capsys):
    """rundir-3046: a meta.json exit status of 2**63 stopped `proflab runs` (TypeError while
    building the table); an integer duration of 400 digits would have been an OverflowError."""
    from proflab.collect.rundir import list_runs

    case = _fuzz_case(tmp_path, "rundir", 3046, "20261122-074634-h100_cuda_train: meta.json: a wrong field")
    assert main(["runs", str(case.paths[0].parent)]) == 0
    run = tmp_path / "runs2" / "r1"
    run.mkdir(parents=True)
    (run / "meta.json").write_text('{"exit_status": 9223372036854775808, "duration_s": 1' + "0" * 400 + ', "name": "x"}')
    (info,) = list_runs(tmp_path / "runs2")
    assert info.exit_status is None and info.duration_s is None
    assert main(["runs", str(tmp_path / "runs2")]) == 0
