"""``analyze --perfetto``: the trace with the findings marked on it, checked by a strict Trace
Event Format check (tests/tef_check.py) on real recorded traces, and by Perfetto's own trace
processor where its binary is present."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import shutil
import subprocess
from pathlib import Path

import msgspec
import pytest

import tef_check
from proflab.analysis import Context
from proflab.api import load
from proflab.cli import main
from proflab.render.perfetto import write_perfetto
from proflab.report.assemble import report_for

DATA_DIR = Path(__file__).resolve().parent / "data"
KINETO_DIR = DATA_DIR / "kineto"
REALISTIC = DATA_DIR / "realistic"
SYNC = REALISTIC / "lm_sync_drain.light.pt.trace.json.xz"
RUN_DIR = DATA_DIR / "runs" / "20261122-074634-h100_cuda_train"


def _marked(path: Path, tmp_path: Path, **kw):
    trace = load(path)
    ctx = Context(trace)
    report = report_for(ctx)
    out = write_perfetto(trace, report, tmp_path / "marked.json", ctx=ctx, **kw)
    return trace, report, tef_check.load(out)


def _ours(doc, cat_prefix):
    return [e for e in doc["traceEvents"] if str(e.get("cat", "")).startswith(cat_prefix)]


def _process_pids(doc) -> dict[str, int]:
    return {e["args"]["name"]: e["pid"] for e in doc["traceEvents"] if e.get("ph") == "M" and e["name"] == "process_name"}


def _overlap(a0, a1, b0, b1) -> bool:
    return a0 < b1 and b0 < a1


# -- the strict check is itself strict ------------------------------------------------------


@pytest.mark.parametrize(
    "event, problem",
    [
        ({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1.0}, "without a finite numeric dur"),
        ({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1.0, "dur": -2}, "negative dur"),
        ({"ph": "X", "name": "k", "pid": 1.5, "tid": 1, "ts": 1.0, "dur": 1}, "pid 1.5"),
        ({"ph": "X", "name": "k", "pid": 1, "tid": True, "ts": 1.0, "dur": 1}, "tid True"),
        ({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": -1, "dur": 1}, "negative ts"),
        ({"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": "5", "dur": 1}, "ts '5'"),
        ({"ph": "C", "name": "c", "pid": 1, "ts": 1, "args": {"v": "high"}}, "is not a finite number"),
        ({"ph": "C", "name": "c", "pid": 1, "ts": 1}, "counter without args"),
        ({"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {}}, "needs args.name"),
        ({"ph": "M", "name": "colour", "pid": 1, "args": {}}, "unknown metadata"),
        ({"ph": "Q", "name": "x", "pid": 1, "ts": 1}, "unknown ph"),
        ({"ph": "s", "name": "f", "pid": 1, "tid": 1, "ts": 1}, "without id"),
        ({"ph": "B", "name": "b", "pid": 1, "tid": 1, "ts": 1}, "never closed"),
        ({"ph": "E", "pid": 1, "tid": 1, "ts": 1}, "no open B"),
        ({"ph": "X", "pid": 1, "tid": 1, "ts": 1, "dur": 1}, "without a string name"),
    ],
)
def test_the_format_check_rejects(event, problem):
    problems = tef_check.check({"traceEvents": [event]})
    assert any(problem in p for p in problems), problems


def test_the_format_check_balances_begin_end_per_thread():
    ok = [{"ph": "B", "name": "a", "pid": 1, "tid": 1, "ts": 1}, {"ph": "E", "pid": 1, "tid": 1, "ts": 2}]
    assert tef_check.check({"traceEvents": ok}) == []
    crossed = [{"ph": "B", "name": "a", "pid": 1, "tid": 1, "ts": 1}, {"ph": "E", "pid": 1, "tid": 2, "ts": 2}]
    assert len(tef_check.check({"traceEvents": crossed})) == 2


def test_the_loader_refuses_nan(tmp_path):
    p = tmp_path / "nan.json"
    p.write_text('{"traceEvents": [{"ph": "C", "name": "c", "pid": 1, "ts": 1, "args": {"v": NaN}}]}')
    with pytest.raises(ValueError):
        tef_check.load(p)


# -- the marked trace -----------------------------------------------------------------------


def test_sync_bound_slices_lie_over_the_sync_gaps_it_names(tmp_path):
    trace, report, doc = _marked(SYNC, tmp_path)
    assert tef_check.check(doc) == []
    sync = next(f for f in report.findings if f.id == "sync_bound")
    slices = [e for e in _ours(doc, "proflab.finding.sync_bound") if e["args"]["finding"] == "sync_bound"]
    assert len(slices) == sync.evidence["sync_gaps"] > 0
    # the first slice carries the evidence, gain and fix
    head = slices[0]["args"]
    assert head["est_gain_ms"] == pytest.approx(sync.est_gain_ms, abs=1e-3) and head["fix"] == sync.fix
    assert head["evidence"]["sync_idle_ms"] == sync.evidence["sync_idle_ms"]
    assert all(e["name"].startswith("sync_bound: ") for e in slices)
    # each one is exactly a gap labelled sync on the idle-gap track ...
    gaps = {(e["ts"], e["dur"]) for e in _ours(doc, "proflab.gap") if e["name"].startswith("sync: ")}
    assert {(e["ts"], e["dur"]) for e in slices} <= gaps
    assert sum(e["dur"] for e in slices) / 1000 == pytest.approx(sync.evidence["sync_idle_ms"], rel=1e-3)
    # ... over which the original trace has no kernel running on that GPU
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
    for s in slices:
        assert not any(_overlap(s["ts"] + 0.001, s["ts"] + s["dur"] - 0.001, k["ts"], k["ts"] + k["dur"]) for k in kernels)


def test_the_original_events_are_kept_verbatim(tmp_path):
    original = json.loads(lzma.decompress(SYNC.read_bytes()))
    _, _, doc = _marked(SYNC, tmp_path)
    n = len(original["traceEvents"])
    assert doc["traceEvents"][:n] == original["traceEvents"]
    assert doc["baseTimeNanoseconds"] == original["baseTimeNanoseconds"]
    assert doc["otherData"]["proflab"]["events"] == "original"
    # our tracks live in processes of their own, named, and no original pid is reused
    ours = {k: v for k, v in _process_pids(doc).items() if k.startswith("proflab: ")}
    for name in ("proflab: findings", "proflab: idle gaps", "proflab: GPU-side steps", "proflab: counters"):
        assert name in ours
    assert not set(ours.values()) & {e.get("pid") for e in original["traceEvents"]}


def test_gaps_steps_and_busy_counter_match_the_report(tmp_path):
    _, report, doc = _marked(SYNC, tmp_path)
    gaps = _ours(doc, "proflab.gap")
    assert len(gaps) == sum(report.idle["gaps_by_cause"].values())
    for cause, n in report.idle["gaps_by_cause"].items():
        assert sum(1 for g in gaps if g["args"]["cause"] == cause) == n
    steps = _ours(doc, "proflab.step")
    assert [e["args"]["step"] for e in steps] == [s["step"] for s in report.steps]
    assert [round(e["dur"] / 1000, 3) for e in steps] == pytest.approx([s["dur_ms"] for s in report.steps], abs=2e-3)
    busy = [e["args"]["busy_pct"] for e in doc["traceEvents"] if e.get("ph") == "C" and "busy" in e["name"]]
    assert busy and all(0.0 <= b <= 100.0 for b in busy)
    # the bins average to the report's busy figure (the last point closes the window at 0)
    assert sum(busy[:-1]) / len(busy[:-1]) == pytest.approx(report.summary["gpu_busy_pct"], abs=1.5)


_TRACES = sorted(REALISTIC.glob("*.light.pt.trace.json.[gx]z")) + sorted(p for p in KINETO_DIR.glob("*.json.gz"))


@pytest.mark.parametrize("path", _TRACES, ids=lambda p: p.name.split(".")[0])
def test_every_recorded_trace_exports_a_valid_marked_trace(path, tmp_path):
    trace = load(path)
    ctx = Context(trace)
    report = report_for(ctx)
    out = write_perfetto(trace, report, tmp_path / "marked.json.gz", ctx=ctx)
    doc = tef_check.load(out)
    assert tef_check.check(doc) == []
    for e in doc["traceEvents"]:
        if e.get("ph") == "C" and "busy_pct" in e["args"]:
            assert 0.0 <= e["args"]["busy_pct"] <= 100.0
    marked = {e["args"]["finding"] for e in _ours(doc, "proflab.finding")}
    assert marked == {f.id for f in report.findings}
    if trace.has_gpu:
        assert _ours(doc, "proflab.counter")
    assert list(tmp_path.iterdir()) == [out]  # no temporary file left beside it


def test_without_the_original_the_model_events_are_written_and_said(tmp_path):
    trace, report, doc = _marked(SYNC, tmp_path, keep_original=False)
    assert tef_check.check(doc) == []
    assert doc["otherData"]["proflab"]["events"] == "model"
    assert doc["otherData"]["proflab"]["notes"]
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kernels) == trace.kernels.height


def test_cli_run_directory_draws_monitor_power(tmp_path, capsys):
    out = tmp_path / "run.perfetto.json"
    assert main(["analyze", str(RUN_DIR), "--perfetto", str(out), "-f", "json", "-o", str(tmp_path / "r.json")]) == 0
    doc = tef_check.load(out)
    assert tef_check.check(doc) == []
    power = [e for e in doc["traceEvents"] if e.get("ph") == "C" and "power" in e["name"]]
    assert power, doc["otherData"]["proflab"]
    # the H100 ran a training loop: board power between idle and its 700 W limit
    assert all(50 <= e["args"]["power_w"] <= 750 for e in power)
    lo = min(e["ts"] for e in doc["traceEvents"] if e.get("cat") == "kernel")
    hi = max(e["ts"] + e["dur"] for e in doc["traceEvents"] if e.get("cat") == "kernel")
    # placed by the trace's base time: the 0.1 s samples bracket its 9 ms of kernels, within a second
    assert any(lo - 1e6 <= e["ts"] <= lo for e in power) and any(hi <= e["ts"] <= hi + 1e6 for e in power)


def test_cli_sliced_read_writes_the_model_events(tmp_path, capsys):
    out = tmp_path / "sliced.json"
    assert main(["analyze", str(SYNC), "--steps", "5:7", "--perfetto", str(out), "-f", "json"]) == 0
    doc = tef_check.load(out)
    assert tef_check.check(doc) == [] and doc["otherData"]["proflab"]["events"] == "model"


def test_report_and_html_output_write_the_marked_trace_beside_the_page(tmp_path, capsys):
    for argv in (["report", str(SYNC), "-o", str(tmp_path / "a.html"), "--perfetto", str(tmp_path / "a.json")],
                 ["analyze", str(SYNC), "-o", str(tmp_path / "b.html"), "--perfetto", str(tmp_path / "b.json.gz")],
                 ["analyze", str(SYNC), "-o", str(tmp_path / "d.html"), "--perfetto", str(tmp_path / "d.json.xz")]):
        assert main(argv) == 0
    assert (tmp_path / "b.json.gz").read_bytes()[:2] == b"\x1f\x8b" and (tmp_path / "d.json.xz").read_bytes()[:6] == b"\xfd7zXZ\x00"
    for name in ("a.json", "b.json.gz", "d.json.xz"):
        doc = tef_check.load(tmp_path / name)
        assert tef_check.check(doc) == []
        assert any(str(e.get("name", "")).startswith("sync_bound") for e in doc["traceEvents"])
    assert (tmp_path / "a.html").stat().st_size > 0 and (tmp_path / "b.html").stat().st_size > 0
    assert main(["report", str(SYNC), str(SYNC), "--no-job", "-o", str(tmp_path / "c.html"),
                 "--perfetto", str(tmp_path / "c.json")]) == 2


def test_cli_refuses_to_overwrite_the_input_and_keeps_old_output_on_failure(tmp_path, capsys):
    src = tmp_path / "t.pt.trace.json.xz"
    shutil.copy(SYNC, src)
    before = src.read_bytes()
    assert main(["analyze", str(src), "--perfetto", str(src)]) == 2
    assert src.read_bytes() == before
    assert "refusing to overwrite" in capsys.readouterr().err
    out = tmp_path / "old.json"
    out.write_text("old")
    bad = tmp_path / "bad.pt.trace.json"
    bad.write_text('{"traceEvents": [')
    assert main(["analyze", str(bad), "--perfetto", str(out)]) == 2
    assert out.read_text() == "old"
    assert main(["analyze", str(SYNC), "--perfetto", str(tmp_path / "x.txt")]) == 2
    assert main(["analyze", str(SYNC), "--perfetto", str(tmp_path / "y.json"), "-o", str(tmp_path / "y.json")]) == 2
    assert main(["analyze", str(SYNC), str(SYNC), "--no-job", "--perfetto", str(tmp_path / "z.json")]) == 2
    assert not (tmp_path / "y.json").exists() and not (tmp_path / "z.json").exists()


def _trace_processor() -> str | None:
    for cand in (os.environ.get("PROFLAB_TRACE_PROCESSOR"), shutil.which("trace_processor_shell"),
                 str(Path.home() / ".local/share/perfetto/prebuilts/trace_processor_shell")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def test_perfettos_trace_processor_reads_the_marked_trace(tmp_path):
    tp = _trace_processor()
    if tp is None:
        pytest.skip("Perfetto's trace_processor_shell is not here: no PyPI wheel ships it (the perfetto package "
                    "downloads it at run time) and this machine has no network; set PROFLAB_TRACE_PROCESSOR to one")
    trace, report, _ = _marked(SYNC, tmp_path)
    out = tmp_path / "marked.json"
    query = tmp_path / "q.sql"
    query.write_text(
        "select (select count(*) from slice where name like 'sync_bound:%') as sync_slices, "
        "(select count(*) from counter_track where name like 'GPU % busy (%%)' or name like 'GPU % busy%') as busy_tracks, "
        "(select count(*) from slice where category = 'kernel') as kernels, "
        "(select ifnull(sum(value), 0) from stats where severity in ('error', 'data_loss') and source = 'trace') as errors;\n"
    )
    got = subprocess.run([tp, "--query-file", str(query), str(out)], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    rows = [line for line in got.stdout.splitlines() if line.strip() and not line.startswith('"sync_slices"')]
    values = [int(v.strip('"')) for v in rows[-1].split(",")]
    sync = next(f for f in report.findings if f.id == "sync_bound")
    assert values[0] == sync.evidence["sync_gaps"]
    assert values[1] >= 1
    assert values[2] == trace.kernels.height
    assert values[3] == 0, got.stdout


H100 = DATA_DIR / "perfetto" / "h100_sync_loop.perfetto.json.gz"


def test_the_marked_trace_written_on_the_h100_is_valid_and_marked():
    """Written on the GPU machine by tests/gpu/test_doctor_gpu.py from a live `proflab run`
    with the monitor on (tests/data/perfetto/README.md)."""
    doc = tef_check.load(H100)
    assert tef_check.check(doc) == []
    report = json.loads(gzip.decompress((DATA_DIR / "perfetto" / "h100_sync_loop.analysis.json.gz").read_bytes()))
    report = report[0] if isinstance(report, list) else report
    sync = next(f for f in report["findings"] if f["id"] == "sync_bound")
    slices = [e for e in _ours(doc, "proflab.finding.sync_bound") if e["args"]["finding"] == "sync_bound"]
    assert len(slices) == sync["evidence"]["sync_gaps"]
    gaps = {(e["ts"], e["dur"]) for e in _ours(doc, "proflab.gap") if e["name"].startswith("sync: ")}
    assert {(e["ts"], e["dur"]) for e in slices} <= gaps
    power = [e["args"]["power_w"] for e in doc["traceEvents"] if e.get("ph") == "C" and "power_w" in e["args"]]
    assert len(power) >= 10 and all(50 <= p <= 750 for p in power)
    busy = [e["args"]["busy_pct"] for e in doc["traceEvents"] if e.get("ph") == "C" and "busy_pct" in e["args"]]
    assert busy and all(0 <= b <= 100 for b in busy)
    assert len(_ours(doc, "proflab.step")) == len(report["steps"])


def test_bare_array_input_is_copied_and_a_mistyped_one_is_not(tmp_path):
    """The Chrome "JSON array" form is copied verbatim; an input with an event a viewer would
    reject (a string dur, which proflab's tolerant reader reads anyway) gets the model's events."""
    events = json.loads(lzma.decompress(SYNC.read_bytes()))["traceEvents"]
    bare = tmp_path / "bare.pt.trace.json"
    bare.write_text(json.dumps(events))
    _, _, doc = _marked(bare, tmp_path)
    assert tef_check.check(doc) == [] and doc["traceEvents"][: len(events)] == events
    k = next(i for i, e in enumerate(events) if e.get("cat") == "kernel")
    events[k]["dur"] = str(events[k]["dur"])
    bad = tmp_path / "mistyped.pt.trace.json"
    bad.write_text(json.dumps({"traceEvents": events}))
    _, _, doc = _marked(bad, tmp_path)
    assert tef_check.check(doc) == []
    assert doc["otherData"]["proflab"]["events"] == "model"
    assert "a viewer would reject" in doc["otherData"]["proflab"]["notes"][0]


def test_model_events_name_their_processes_and_streams(tmp_path):
    trace, _, doc = _marked(SYNC, tmp_path, keep_original=False)
    names = {(e["pid"], e.get("tid"), e["args"]["name"]) for e in doc["traceEvents"] if e.get("ph") == "M" and "name" in e["args"]}
    for dev, stream in trace.gpu.select("device", "stream").unique().iter_rows():
        assert (dev, stream, f"stream {stream}") in names
    for pid in trace.cpu["pid"].unique().to_list():
        assert (pid, 0, f"host process {pid}") in names


_PACKED = {"gzip": (".gz", gzip.compress), "xz": (".xz", lambda b: lzma.compress(b, preset=0)), "plain": ("", lambda b: b)}


@pytest.mark.parametrize("form", list(_PACKED))
def test_the_original_is_checked_and_copied_a_slice_at_a_time(tmp_path, form, monkeypatch):
    """A trace in Kineto's layout is checked slice by slice and its events copied from the
    file when written (``_streamed``): the same fields and the same bytes between the
    brackets as the whole document gives, here with slices small enough to be many."""
    from proflab.render import perfetto

    monkeypatch.setattr(perfetto, "_COPY_BYTES", 64 * 1024)
    suffix, pack = _PACKED[form]
    data = lzma.decompress(SYNC.read_bytes())
    path = tmp_path / f"t.pt.trace.json{suffix}"
    path.write_bytes(pack(data))
    got = perfetto._streamed(path)
    assert got is not None
    whole = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    inside = bytes(perfetto._inside(memoryview(whole.pop("traceEvents"))))
    assert {k: bytes(v) for k, v in got.fields.items()} == {k: bytes(v) for k, v in whole.items()}
    assert b"".join(bytes(c) for c in got.events()) == inside
    # an event a viewer would reject: not streamed, so the whole-document path says which
    bad = data.replace(b'"ph": "X"', b'"ph": "?"', 1)
    assert bad != data
    path.write_bytes(pack(bad))
    assert perfetto._streamed(path) is None
