"""Bad input: one clear line on stderr naming the file and the problem, exit 2, no traceback,
and the input left exactly as it was. Plus the inputs that look odd but are *not* errors."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from proflab.cli import main

# A kernel event shaped like Kineto's, to be broken one field at a time.
_KERNEL = {
    "ph": "X",
    "cat": "kernel",
    "name": "void gemm_kernel<float>(float*)",
    "pid": 0,
    "tid": 7,
    "ts": 1000.5,
    "dur": 12.25,
    "args": {"device": 0, "stream": 7, "correlation": 42, "External id": 3, "grid": [1, 1, 1], "block": [128, 1, 1]},
}
_CPU_OP = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 990.0, "dur": 20.0, "args": {"External id": 3}}


def _json(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _gz_payload(trace: Path) -> bytes:
    return gzip.decompress(trace.read_bytes())


def _first_half(p: Path, raw: bytes) -> Path:
    p.write_bytes(raw[: len(raw) // 2])
    return p


def _truncated_gz(d: Path, trace: Path) -> Path:
    return _first_half(d / "cut.pt.trace.json.gz", trace.read_bytes())


def _corrupt_gz(d: Path, trace: Path) -> Path:
    p = d / "corrupt.pt.trace.json.gz"
    p.write_bytes(b"\x1f\x8b" + bytes(range(7, 250)) * 4)
    return p


def _truncated_xz(d: Path, trace: Path) -> Path:
    import lzma

    return _first_half(d / "cut.pt.trace.json.xz", lzma.compress(_gz_payload(trace), preset=0))


def _corrupt_xz(d: Path, trace: Path) -> Path:
    p = d / "corrupt.pt.trace.json.xz"
    p.write_bytes(b"\xfd7zXZ\x00" + bytes(range(7, 250)) * 4)
    return p


def _json_middle_cut(d: Path, trace: Path) -> Path:
    data = _gz_payload(trace)
    mid = len(data) // 2
    p = d / "midcut.pt.trace.json"
    p.write_bytes(data[:mid] + data[mid + 997 :])
    return p


def _json_truncated(d: Path, trace: Path) -> Path:
    data = _gz_payload(trace)
    p = d / "truncated.pt.trace.json"
    p.write_bytes(data[: len(data) // 2])
    return p


def _not_a_trace_object(d, trace):
    return _json(d / "object.json", {"a": 1})


def _not_a_trace_array(d, trace):
    return _json(d / "array.json", [1, 2])


def _not_a_trace_number(d, trace):
    return _json(d / "number.json", 42)


def _ts_string(d, trace):
    return _json(d / "ts.json", {"traceEvents": [_CPU_OP, {**_KERNEL, "ts": "abc"}]})


def _correlation_string(d, trace):
    return _json(d / "corr.json", {"traceEvents": [_CPU_OP, {**_KERNEL, "args": {**_KERNEL["args"], "correlation": "x"}}]})


def _unknown_categories(d, trace):
    evs = [{**_KERNEL, "cat": "mystery_cat"}, {**_CPU_OP, "cat": "other_cat"}, {**_CPU_OP, "cat": "other_cat"}]
    return _json(d / "unknown.json", {"traceEvents": evs})


def _empty_file(d, trace):
    p = d / "empty.json"
    p.write_bytes(b"")
    return p


def _no_events(d, trace):
    return _json(d / "noevents.json", {"traceEvents": []})


def _metadata_only(d, trace):
    evs = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "thread 1 (python3)"}},
        {"ph": "M", "name": "process_sort_index", "pid": 0, "tid": 0, "args": {"sort_index": 0}},
    ]
    return _json(d / "meta.json", {"schemaVersion": 1, "traceEvents": evs})


def _empty_dir(d, trace):
    p = d / "traces"
    p.mkdir()
    (p / "README.txt").write_text("not a trace\n")
    return p


def _missing_path(d, trace):
    return d / "no_such_trace.pt.trace.json.gz"


def _binary_file(d, trace):
    p = d / "model.bin"
    p.write_bytes(bytes(range(256)) * 16)
    return p


def _binary_named_json(d, trace):
    p = d / "weights.pt.trace.json"
    p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
    return p


def _ts_out_of_range(d, trace):
    # A float microsecond timestamp whose nanosecond value does not fit in int64.
    return _json(d / "hugets.json", {"traceEvents": [_CPU_OP, {**_KERNEL, "ts": 1e17}]})


def _device_out_of_range(d, trace):
    return _json(d / "bigdev.json", {"traceEvents": [_CPU_OP, {**_KERNEL, "args": {**_KERNEL["args"], "device": 2**40}}]})


def _odd_value_then_malformed(d, trace):
    # the strict decode stops at the odd value; the malformed JSON after it must still be named
    text = json.dumps({"traceEvents": [{**_CPU_OP, "args": {"grid": "grid(1,)"}}, _KERNEL]})
    p = d / "oddthenbad.json"
    p.write_text(text[:-3] + ",}]}")
    return p


# id -> (make(dir, real_gz_trace) -> path, regex the message must match once the path is removed)
CASES = {
    "truncated-gz": (_truncated_gz, r"truncat|ends early|incomplete"),
    "corrupt-gzip": (_corrupt_gz, r"gzip|compress"),
    "truncated-xz": (_truncated_xz, r"truncat|ends early|incomplete"),
    "corrupt-xz": (_corrupt_xz, r"xz|compress"),
    "json-bytes-cut-from-middle": (_json_middle_cut, r"JSON|malformed"),
    "json-truncated": (_json_truncated, r"truncat|ends early"),
    "json-object-not-trace": (_not_a_trace_object, r"traceEvents|not a (profiler )?trace"),
    "json-array-not-trace": (_not_a_trace_array, r"trace|event|expected"),
    "json-number-not-trace": (_not_a_trace_number, r"trace|format"),
    "all-categories-unknown": (_unknown_categories, r"categor"),
    "odd-value-then-malformed-json": (_odd_value_then_malformed, r"JSON|malformed"),
    "empty-file": (_empty_file, r"empty"),
    "empty-traceEvents": (_no_events, r"no events|empty"),
    "metadata-only": (_metadata_only, r"metadata|no (host|GPU|host or GPU) events"),
    "dir-without-traces": (_empty_dir, r"no trace"),
    "missing-path": (_missing_path, r"no such|not found|does not exist"),
    "binary-file": (_binary_file, r"format|not .*trace"),
    "binary-named-json": (_binary_named_json, r"format|not .*trace|JSON"),
}

def _params():
    return [pytest.param(k, id=k) for k in CASES]


def _make(case: str, tmp_path: Path, cpu_trace: Path, copy_trace) -> tuple[Path, str]:
    make, problem = CASES[case]
    d = tmp_path / "in"
    d.mkdir()
    # real gz bytes come from a private copy, so the committed trace can never be touched
    real = copy_trace(cpu_trace, tmp_path / "src")
    return make(d, real), problem


def _snapshot(p: Path):
    """Everything about the input that a read-only tool must not change."""
    if not p.exists():
        return ("absent",)
    if p.is_dir():
        return ("dir", sorted((c.name, c.read_bytes(), c.stat().st_mtime_ns) for c in p.iterdir()), p.stat().st_mtime_ns)
    return ("file", p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_size)


def _check_one_line(err: str, path: Path, problem: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    line = lines[0]
    assert "Traceback" not in err
    assert str(path) in line, f"the message does not name the file: {line!r}"
    rest = line.replace(str(path), "<FILE>")
    assert re.search(problem, rest, re.IGNORECASE), f"the message does not say the problem ({problem}): {line!r}"


@pytest.mark.parametrize("case", _params())
def test_bad_input_via_main(case, tmp_path, cpu_trace, copy_trace, capsys):
    path, problem = _make(case, tmp_path, cpu_trace, copy_trace)
    before = _snapshot(path)
    rc = main(["analyze", str(path)])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    _check_one_line(err, path, problem)
    assert _snapshot(path) == before


@pytest.mark.parametrize("case", _params())
def test_bad_input_via_subprocess(case, tmp_path, cpu_trace, copy_trace):
    path, problem = _make(case, tmp_path, cpu_trace, copy_trace)
    before = _snapshot(path)
    r = subprocess.run(
        [sys.executable, "-m", "proflab", "analyze", str(path)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    _check_one_line(r.stderr, path, problem)
    assert _snapshot(path) == before


def test_bad_file_among_good_ones_fails_the_run(tmp_path, cpu_trace, capsys, copy_trace):
    good = copy_trace(cpu_trace, tmp_path)
    bad = _json(tmp_path / "bad.json", {"a": 1})
    rc = main(["analyze", str(good), str(bad), "-f", "json"])
    out, err = capsys.readouterr()
    assert rc == 2
    _check_one_line(err, bad, r"trace")


# -- -o must never overwrite an input ----------------------------------------------------------


def _refused(argv, protected: Path, capsys) -> None:
    before = _snapshot(protected)
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.search(r"overwrite|input", lines[0], re.IGNORECASE), lines[0]
    assert _snapshot(protected) == before
    assert not [p for p in protected.parent.iterdir() if p.name.endswith(".tmp")]


def test_output_onto_the_input_trace_is_refused(tmp_path, cpu_trace, capsys, copy_trace):
    trace = copy_trace(cpu_trace, tmp_path)
    _refused(["analyze", str(trace), "-o", str(trace)], trace, capsys)


def test_output_onto_the_input_by_another_spelling_is_refused(tmp_path, cpu_trace, capsys, copy_trace):
    trace = copy_trace(cpu_trace, tmp_path / "run")
    (tmp_path / "other").mkdir()
    other_spelling = tmp_path / "other" / ".." / "run" / trace.name
    _refused(["analyze", str(trace), "-o", str(other_spelling), "-f", "json"], trace, capsys)


def test_output_onto_the_input_given_relative_is_refused(tmp_path, cpu_trace, capsys, copy_trace, monkeypatch):
    trace = copy_trace(cpu_trace, tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    _refused(["analyze", f"run/{trace.name}", "-o", str(trace)], trace, capsys)
    _refused(["analyze", str(trace), "-o", f"./run/{trace.name}"], trace, capsys)


def test_output_onto_the_input_through_a_symlink_is_refused(tmp_path, cpu_trace, capsys, copy_trace):
    trace = copy_trace(cpu_trace, tmp_path / "run")
    link = tmp_path / "latest.pt.trace.json.gz"
    link.symlink_to(trace)
    _refused(["analyze", str(link), "-o", str(trace)], trace, capsys)


def test_output_onto_a_trace_inside_an_input_folder_is_refused(tmp_path, cpu_trace, capsys, copy_trace):
    folder = tmp_path / "tb"
    trace = copy_trace(cpu_trace, folder, "worker0.1790857026000.pt.trace.json.gz")
    _refused(["analyze", str(folder), "-o", str(trace)], trace, capsys)


# -- odd but valid ---------------------------------------------------------------------------

# A value of an unexpected type costs that value (or its event), never the trace: the trace is
# read, analysed, and the report's notes name the field and what was done. Synthetic edge cases
# (labelled as such): each breaks one field of a small Kineto-shaped document.
def _grid_string(d, trace):
    # torch.compile (Triton) launches: the cpu_op carries the grid as Python source text
    op = {**_CPU_OP, "name": "triton_poi_fused_add_0", "args": {**_CPU_OP["args"], "grid": "grid(100,)"}}
    return _json(d / "grid.json", {"traceEvents": [op, _KERNEL]})


def _stream_string(d, trace):
    # ROCm traces: HIP runtime calls carry their stream as a handle written as text
    call = {"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 1, "tid": 1, "ts": 995.0, "dur": 3.0,
            "args": {"correlation": 42, "stream": "0x5f3c2a0"}}
    return _json(d / "stream.json", {"traceEvents": [_CPU_OP, call, _KERNEL]})


def _args_not_object(d, trace):
    return _json(d / "args.json", {"traceEvents": [_CPU_OP, {**_KERNEL, "args": "none"}]})


def _event_not_object(d, trace):
    return _json(d / "item.json", {"traceEvents": [_CPU_OP, 17, _KERNEL]})


# id -> (make, note regex, (table, column, expected values) checked on the loaded trace)
TOLERATED = {
    "ts-is-string": (_ts_string, r"^ts: 1 value was a string, event dropped$", ("gpu", "name", [])),
    "ts-is-numeric-string": (
        lambda d, t: _json(d / "tsnum.json", {"traceEvents": [_CPU_OP, {**_KERNEL, "ts": "1000.5"}]}),
        r"^ts: 1 value was a string, read as a number$", ("gpu", "start_ns", [1_000_500]),
    ),
    "dur-is-null": (
        lambda d, t: _json(d / "durnull.json", {"traceEvents": [_CPU_OP, {**_KERNEL, "dur": None}]}),
        r"^dur: 1 value was null, event dropped$", ("gpu", "name", []),
    ),
    # a kernel without ts has no place on the timeline: dropped and counted, not placed at 0
    "ts-missing": (
        lambda d, t: _json(d / "tsmissing.json", {"traceEvents": [
            _CPU_OP, {k: v for k, v in _KERNEL.items() if k != "ts"},
            {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "python"}},  # metadata: no ts, not counted
        ]}),
        r"^ts: 1 value was missing, event dropped$", ("gpu", "name", []),
    ),
    "ts-null": (
        lambda d, t: _json(d / "tsnull.json", {"traceEvents": [_CPU_OP, {**_KERNEL, "ts": None}]}),
        r"^ts: 1 value was missing, event dropped$", ("gpu", "name", []),
    ),
    # the same through the tolerant decode (another value of the slice has an odd type)
    "ts-missing-tolerant": (
        lambda d, t: _json(d / "tsmissing2.json", {"traceEvents": [
            _CPU_OP, {k: v for k, v in _KERNEL.items() if k != "ts"}, {**_KERNEL, "args": {**_KERNEL["args"], "grid": "grid(1,)"}},
        ]}),
        r"^ts: 1 value was missing, event dropped$", ("gpu", "start_ns", [1_000_500]),
    ),
    "correlation-is-string": (_correlation_string, r"^args.correlation: 1 value was a string, ignored$", ("gpu", "correlation", [None])),
    "ts-beyond-int64-ns": (_ts_out_of_range, r"^ts: 1 value was out of range, event dropped$", ("gpu", "name", [])),
    "device-beyond-int32": (_device_out_of_range, r"^args.device: 1 value was out of range, ignored$", ("gpu", "device", [0])),
    "grid-is-string": (_grid_string, r"^args.grid: 1 value was a string, ignored$", ("gpu", "grid_x", [1])),
    "stream-is-hex-string": (_stream_string, r"^args.stream: 1 value was a string, read as an integer$", ("gpu", "stream", [7])),
    "args-not-object": (_args_not_object, r"^args: 1 value was a string, ignored$", ("gpu", "correlation", [None])),
    "event-not-object": (_event_not_object, r"^event: 1 item was a number, not an event, ignored$", ("gpu", "correlation", [42])),
}


@pytest.mark.parametrize("case", list(TOLERATED))
def test_value_of_unexpected_type_is_dropped_and_noted(case, tmp_path, cpu_trace, copy_trace, capsys):
    make, note, (table, column, expected) = TOLERATED[case]
    path = make(tmp_path, cpu_trace)
    rc = main(["analyze", str(path), "-f", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert err == ""
    notes = json.loads(out)["notes"]
    assert any(re.search(note, n) for n in notes), notes
    from proflab import load

    trace = load(path)
    assert getattr(trace, table)[column].to_list() == expected
    assert trace.cpu.filter(pl.col("name") == _CPU_OP["name"]).height + trace.cpu.filter(pl.col("name").str.starts_with("triton")).height == 1


def test_tolerant_slice_keeps_the_fast_path_elsewhere(tmp_path, cpu_trace, monkeypatch):
    """A real trace with one odd value in one slice: that slice is decoded tolerantly, every
    other slice strictly, and the tables equal the unbroken trace's but for that value."""
    from proflab.readers import kineto

    doc = json.loads(_gz_payload(cpu_trace))
    ops = [i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "cpu_op"]
    doc["traceEvents"][ops[len(ops) // 2]]["args"]["grid"] = "grid(100,)"
    odd = tmp_path / "odd.pt.trace.json"
    # Kineto's own layout (one event per block), so that the file is sliced
    odd.write_text('{\n  "traceEvents": [\n' + ",\n".join("  " + json.dumps(e, indent=2).replace("\n", "\n  ") for e in doc["traceEvents"]) + "\n]}\n")
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 64 << 10)
    calls = []
    real = kineto._tolerant.loose_events
    monkeypatch.setattr(kineto._tolerant, "loose_events", lambda p: calls.append(1) or real(p))
    trace = kineto.read(odd)
    assert len(calls) == 1
    clean = kineto.read(cpu_trace)
    assert trace.cpu.equals(clean.cpu) and trace.steps.equals(clean.steps)
    assert "args.grid: 1 value was a string, ignored" in trace.meta.notes


def test_unknown_categories_among_known_ones_are_noted_not_fatal(tmp_path, cpu_trace, capsys):
    doc = json.loads(_gz_payload(cpu_trace))
    template = next(e for e in doc["traceEvents"] if e.get("cat") == "cpu_op")
    doc["traceEvents"] += [{**template, "cat": "future_kineto_cat", "name": f"x{i}"} for i in range(3)]
    doc["traceEvents"].append({**template, "cat": "another_new_cat"})
    p = tmp_path / "extra_cats.pt.trace.json.gz"
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))

    rc = main(["analyze", str(p), "-f", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    report = json.loads(out)
    notes = " ".join(report["notes"])
    assert "future_kineto_cat" in notes and "another_new_cat" in notes, report["notes"]
    # the known events were analysed as usual
    assert report["summary"]["step_count"] >= 1
    assert report["host_ops"]


def test_cpu_only_trace_is_analysed_and_says_what_was_skipped(cpu_trace, capsys):
    rc = main(["analyze", str(cpu_trace), "-f", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert err == ""
    report = json.loads(out)
    # missing is not zero: no GPU numbers at all, and the report says why
    assert report["summary"]["gpu_busy_pct"] is None
    assert report["summary"]["breakdown_ms"] is None
    assert report["kernels"] == []
    gpu_missing = [m for m in report["missing"] if "GPU" in m["signal"] or "GPU" in m["reason"]]
    assert gpu_missing, report["missing"]
    skipped = [s for m in gpu_missing for s in m["skipped"]]
    assert skipped, "the report must list which GPU analyses were skipped"
    assert any("kernel" in s for s in skipped), skipped


def test_cpu_only_trace_terminal_says_what_is_missing(cpu_trace, capsys):
    rc = main(["analyze", str(cpu_trace), "--width", "100"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert re.search(r"missing.*GPU", out), out


@pytest.mark.parametrize(
    "first_ts_us",
    [2.0e13, 1.7e15],
    ids=["monotonic-clock-after-231-days-uptime", "unix-epoch-microseconds"],
)
def test_large_but_valid_timestamps_are_read(first_ts_us, tmp_path, cpu_trace, cpu_report, capsys):
    # Kineto's ts is microseconds on the host clock; its value depends on the machine (uptime,
    # or the Unix epoch in older traces). Anything whose nanoseconds fit in int64 is valid.
    doc = json.loads(_gz_payload(cpu_trace))
    timed = [e for e in doc["traceEvents"] if isinstance(e.get("ts"), (int, float))]
    shift = first_ts_us - min(e["ts"] for e in timed)
    for e in timed:
        e["ts"] += shift
    p = tmp_path / "late.pt.trace.json.gz"
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))

    rc = main(["analyze", str(p), "-f", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    got = json.loads(out)["summary"]
    assert got["step_count"] == cpu_report.summary["step_count"]
    # a shift of the clock changes no duration (up to float64 spacing of the shifted us values)
    assert got["wall_ms"] == pytest.approx(cpu_report.summary["wall_ms"], abs=0.005)
    assert got["median_step_ms"] == pytest.approx(cpu_report.summary["median_step_ms"], abs=0.005)
