"""GPU memory analysis against workloads recorded on an H100 with known answers
(tests/data/memory, tests/data/record/record_memory.py): the allocator's own
max_memory_allocated / max_memory_reserved over the profiled steps, the memory allocated after
each step, and what each workload was built to show."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

import proflab
from proflab.cli import main

DATA = Path(__file__).parent / "data" / "memory"
GT = json.loads((DATA / "ground_truth.json").read_text())
WORKLOADS = ["graph_leak", "activation_heavy", "optimizer_heavy", "fragmenting", "healthy"]
RUN = DATA / "run_leak"


@pytest.fixture(scope="module")
def reports():
    return {n: proflab.analyze(DATA / f"{n}.pt.trace.json.gz") for n in WORKLOADS}


def _mem_findings(rep):
    return [f for f in rep.findings if f.category.startswith("memory_")]


@pytest.mark.parametrize("name", WORKLOADS)
def test_peak_matches_the_allocator(reports, name):
    d = reports[name].memory["devices"][0]
    gt = GT[name]
    assert d["peak_allocated_mib"] == pytest.approx(gt["max_memory_allocated_mib"], rel=0.02)
    assert d["peak_reserved_mib"] == pytest.approx(gt["max_memory_reserved_mib"], rel=0.02)
    assert d["device_memory_mib"] == pytest.approx(gt["device_total_memory_mib"], rel=0.02)
    # per step: the unprofiled repeat of the same steps peaks where the trace says
    peaks = [s["peak_allocated_mib"] for s in reports[name].memory["steps"]]
    want = [p["allocated_mib"] for p in gt["per_step_peak_unprofiled"]]
    assert peaks == pytest.approx(want, rel=0.02)


@pytest.mark.parametrize(
    "name, top",
    [("graph_leak", "memory_leak"), ("fragmenting", "memory_fragmentation"), ("activation_heavy", "memory_headroom"),
     ("optimizer_heavy", "memory_headroom"), ("healthy", "memory_headroom")],
)
def test_right_finding_on_top(reports, name, top):
    fs = _mem_findings(reports[name])
    assert fs and fs[0].category == top
    if name in ("activation_heavy", "optimizer_heavy", "healthy"):
        assert all(f.severity == "info" for f in fs), [f.title for f in fs]  # nothing to warn about
    else:
        assert fs[0].severity in ("warning", "critical")
    others = {f.category for f in fs[1:]}
    assert "memory_leak" not in others and ("memory_fragmentation" not in others or name == "fragmenting")


def test_leak_rate_and_steps_until_full(reports):
    f = _mem_findings(reports["graph_leak"])[0]
    after = GT["graph_leak"]["memory_allocated_after_step_mib"]
    rate = (after[-1] - after[0]) / (len(after) - 1)  # the allocator's own, 40 MiB a step
    assert f.evidence["growth_mb_per_step"] == pytest.approx(rate, rel=0.02)
    total = GT["graph_leak"]["device_total_memory_mib"]
    want = (total - GT["graph_leak"]["max_memory_allocated_mib"]) / rate
    assert f.evidence["steps_until_device_full"] == pytest.approx(want, rel=0.02)
    assert "MiB per step" in f.title and "steps" in f.title
    # what is kept: the validation forward's outputs (relu, mse_loss) made in the forward
    kept = f.evidence["retained_never_freed"]
    assert kept[0]["phase"] == "forward" and kept[0]["op"] in ("aten::clamp_min", "aten::relu", "aten::addmm")
    assert "torch.no_grad()" in f.fix and "loss.item()" in f.fix


def test_fragmentation_names_the_allocator_setting(reports):
    f = _mem_findings(reports["fragmenting"])[0]
    gt = GT["fragmenting"]
    assert f.evidence["reserved_unused_at_peak_mib"] == pytest.approx(gt["max_memory_reserved_mib"] - gt["max_memory_allocated_mib"], rel=0.02)
    assert "expandable_segments:True" in f.fix
    assert f.evidence["reserved_growth_with_free_cache"]["events"] >= 1
    # a growing-shape loop keeps nothing: no leak, though the level after each step rises
    assert not any(x.category == "memory_leak" for x in _mem_findings(reports["fragmenting"]))


def test_what_holds_the_peak(reports):
    act = reports["activation_heavy"].memory["devices"][0]
    assert act["dominant_category"] == "activation"
    assert act["by_category_mib"]["activation"] > 0.7 * act["peak_allocated_mib"]
    assert act["peak_phase"] in ("forward", "backward")  # the end of the forward / start of the backward
    # recorded with stacks: activations carry the module and the user's line that made them
    top = [r for r in act["top_allocations"] if r["category"] == "activation"]
    assert any(r["module"] and r["source"] and r["source"].startswith("record_memory.py(") for r in top)
    opt = reports["optimizer_heavy"].memory["devices"][0]
    assert opt["peak_phase"] == "optimizer"
    assert opt["dominant_category"] == "optimizer_state"
    # Adam's two states of a 268M-parameter model: 2 GiB, estimated from the gradients' bytes
    assert opt["persistent_split"]["optimizer_state_mib"] == pytest.approx(2048, rel=0.02)
    assert opt["top_allocations"][0]["within"].startswith("aten::_foreach_")
    head = _mem_findings(reports["optimizer_heavy"])[0]
    assert "fused=True" in head.fix and "optimizer state" in head.title
    assert "checkpoint" in _mem_findings(reports["activation_heavy"])[0].fix


def test_report_contract(reports, report_schema):
    jsonschema = pytest.importorskip("jsonschema")
    for rep in reports.values():
        d = rep.to_dict()
        jsonschema.validate(d, report_schema)
        assert d["memory"]["findings"] == [f["id"] for f in d["findings"] if f["category"].startswith("memory_")]
        srcs = d["memory"]["sources"]
        assert srcs["kineto_memory_events"]["available"] and not srcs["nvml"]["available"]


def test_no_memory_events_no_section():
    rep = proflab.analyze(Path(__file__).parent / "data" / "realistic" / "lm_bf16.light.pt.trace.json.xz")
    assert rep.memory is None and "memory" not in rep.to_dict()
    assert not _mem_findings(rep)


def test_run_directory_sources_and_collection_cost(report_schema):
    rep = proflab.analyze(next((RUN / "traces").glob("*.pt.trace.json.gz")))
    m = rep.to_dict()["memory"]
    assert {k for k, v in m["sources"].items() if v["available"]} == {"kineto_memory_events", "nvml", "snapshot"}
    assert m["nvml"][0]["max_used_mib"] >= m["devices"][0]["peak_reserved_mib"]  # NVML counts the context too
    assert m["snapshot"]["devices"][0]["reserved_bytes"] > 0
    c = m["collection"]
    proc = json.loads(next((RUN / "processes").glob("*.json")).read_text())["step_times"]
    assert c["run_bare_step_ms"] == proc["bare_ms"] and c["run_profiled_step_ms"] == proc["profiled_ms"]
    assert any(n.startswith("--profile-memory recorded") for n in m["notes"])
    # steps come from ProfilerStep here: four of them, 40 MiB more kept after each
    assert [s["step"] for s in m["steps"]] == [4, 5, 6, 7]
    assert _mem_findings(rep)[0].category == "memory_leak"


def test_cli_memory_section_and_plots(tmp_path, capsys):
    trace = DATA / "fragmenting.pt.trace.json.gz"
    assert main(["memory", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "peak 2,647.8 MiB allocated" in out and "expandable_segments" in out
    assert main(["memory", str(RUN), "-f", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["findings"][0]["category"] == "memory_leak"
    png, svg = tmp_path / "m.png", tmp_path / "m.svg"
    assert main(["memory", str(trace), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["memory", str(RUN), "-o", str(svg)]) == 0
    assert b"<svg" in svg.read_bytes()[:2000]
    md = tmp_path / "r.md"
    assert main(["analyze", str(DATA / "graph_leak.pt.trace.json.gz"), "-o", str(md)]) == 0
    assert "## GPU memory" in md.read_text()


def test_cli_memory_without_events_is_one_line(tmp_path, capsys):
    rc = main(["memory", str(Path(__file__).parent / "data" / "realistic" / "lm_bf16.light.pt.trace.json.xz")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "no GPU memory" in err


# -- snapshots ------------------------------------------------------------------------------


def test_real_snapshot_pickle_reads_without_globals(capsys):
    assert main(["memory", str(DATA / "graph_leak.snapshot.pickle.gz")]) == 0
    out = capsys.readouterr().out
    # the snapshot was taken at the end of the graph_leak window: what was allocated then
    assert "snapshot GPU 0: 393 MiB" in out and "record_memory.py:94 step" in out
    # what proflab run writes: JSON converted inside the profiled process
    assert main(["memory", str(next(RUN.glob("memory_snapshot_*.json.gz")))]) == 0
    assert "snapshot GPU 0: 65 MiB in 3 blocks of 930 MiB reserved" in capsys.readouterr().out


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("gz", [False, True])
def test_snapshot_pickle_with_a_payload_is_refused(tmp_path, capsys, gz):
    """A pickle whose reduce calls os.system: refused before anything runs, one line, exit 2."""
    marker = tmp_path / "pwned"
    data = pickle.dumps({"segments": [], "device_traces": [_Payload(marker)]}, protocol=4)
    path = tmp_path / ("memory_snapshot_1.pickle" + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(data) if gz else data)
    before = path.read_bytes()
    rc = main(["memory", str(path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "refused" in err and str(path) in err
    assert "Traceback" not in err
    assert not marker.exists()
    assert path.read_bytes() == before


def test_run_directory_with_a_hostile_snapshot_still_reports(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    for p in run.glob("memory_snapshot_*"):
        p.unlink()
    marker = tmp_path / "pwned"
    (run / "memory_snapshot_9.pickle").write_bytes(pickle.dumps({"segments": [_Payload(marker)]}))
    rep = proflab.analyze(next((run / "traces").glob("*.pt.trace.json.gz")))
    assert not marker.exists()
    assert any(m.signal == "memory snapshot" and "refused" in m.reason for m in rep.missing)
    m = rep.to_dict()["memory"]  # the rest of the section stands
    assert m["sources"]["snapshot"]["available"] is False and m["devices"][0]["peak_allocated_mib"] > 0


def test_run_notes_carry_the_profile_memory_cost(tmp_path):
    from proflab.collect.launcher import analyze_run

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    meta = json.loads((run / "meta.json").read_text())
    analyze_run(run, meta)
    notes = json.loads((run / "meta.json").read_text())["notes"]
    line = next(n for n in notes if n.startswith("--profile-memory recorded"))
    assert "93 allocation events per step" in line and "3.30 ms bare, 4.90 ms profiled" in line


def test_series_thinned_keeps_measured_points_and_the_peaks():
    """The chart series (report memory.devices[].series): every event when there are few, else
    at most max_points of them, each a measured (time, allocated, reserved) event, the peaks
    kept (activation_heavy's real allocation timeline, thinned hard)."""
    from proflab.analysis.memory import _series, memory_for_trace

    a = memory_for_trace(proflab.load(DATA / "activation_heavy.pt.trace.json.gz"))
    t = a.timelines[0]
    full = a.devices[0]["series"]
    assert full["points"] == full["events"] == len(t["ts_ns"]) == len(full["t_ms"])
    s = _series(t["ts_ns"], t["allocated"], t["reserved"], a.origin_ns, a.step_bounds, max_points=300)
    assert s["events"] == len(t["ts_ns"]) and 0 < s["points"] <= 300
    measured = set(zip(full["t_ms"], full["allocated_mib"], full["reserved_mib"]))
    assert set(zip(s["t_ms"], s["allocated_mib"], s["reserved_mib"])) <= measured
    assert s["t_ms"] == sorted(s["t_ms"])
    assert max(s["allocated_mib"]) == a.devices[0]["peak_allocated_mib"] and max(s["reserved_mib"]) == a.devices[0]["peak_reserved_mib"]
    assert min(s["allocated_mib"]) == min(full["allocated_mib"])
    assert [x["step"] for x in s["step_starts_ms"]] == [0, 1, 2, 3]


def test_an_unmarked_gz_trace_over_the_scan_size_is_not_read_again(monkeypatch):
    """A trace that does not say it was recorded with profile_memory is read a second time
    for [memory] events only when its JSON is small: measured by the JSON, not the .gz file
    (a 50 MB .gz of a 514 MB trace was read whole again, 1.45 GB at the peak). The committed
    train loop's JSON is 8.6 MB in a 0.6 MB .gz; the limit is set between the two."""
    import polars as pl

    from proflab.analysis import memory as am
    from proflab.readers import memory as rm

    path = Path(__file__).parent / "data" / "kineto" / "train_loop.pt.trace.json.gz"
    trace = proflab.load(path, cache=False)
    assert trace.meta.profile_memory is None and trace.meta.size_bytes > 4 * path.stat().st_size
    read: list = []
    none = pl.DataFrame(schema=rm.MEMORY_SCHEMA)
    monkeypatch.setattr(rm, "kineto_memory", lambda p: read.append(p) or (none, False, 0))
    monkeypatch.setattr(am, "_SCAN_UNMARKED_BYTES", 2 * path.stat().st_size)
    m = am.memory_for_trace(trace)
    assert read == [] and not m.sources["kineto_memory_events"]["available"]
    monkeypatch.setattr(am, "_SCAN_UNMARKED_BYTES", 2 * trace.meta.size_bytes)
    am.memory_for_trace(trace)
    assert read == [str(path)]


def test_sizes_of_2_20_bytes_are_labelled_mib(capsys):
    """``proflab memory`` once printed "peak 6,306.0 MB" and wrote ``peak_allocated_mb`` for
    6,612,276,736 bytes (6,306 MiB, 6,612 MB). A size of 2^20-byte units says MiB, in its key
    and its text, in every format: the peak is the largest allocated total in bytes over 2^20."""
    trace = DATA / "fragmenting.pt.trace.json.gz"
    assert main(["memory", str(trace), "-f", "json"]) == 0
    d = json.loads(capsys.readouterr().out)

    def keys(x):
        if isinstance(x, dict):
            for k, v in x.items():
                yield k
                yield from keys(v)
        elif isinstance(x, list):
            for v in x:
                yield from keys(v)

    assert not [k for k in keys(d) if k == "mb" or k.endswith("_mb")]
    dev = d["memory"]["devices"][0] if "memory" in d else d["devices"][0]
    events = json.loads(gzip.open(trace).read())["traceEvents"]
    peak_bytes = max(e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1)
    assert peak_bytes == 2_776_384_512  # 2,647.8 MiB; 2,776.4 MB
    assert dev["peak_allocated_mib"] == pytest.approx(peak_bytes / 2**20, abs=1e-3)
    for fmt in ("term", "md"):
        assert main(["memory", str(trace), "-f", fmt]) == 0
        out = capsys.readouterr().out
        assert "MiB" in out and " MB" not in out and "(MB)" not in out
    report = proflab.analyze(trace)
    for f in report.findings:
        if f.category.startswith("memory_"):
            assert " MB" not in f.title and " MB" not in f.fix
            assert not [k for k in f.evidence if k.endswith("_mb")]


def test_no_key_in_the_package_says_mb_for_2_20_bytes():
    """Keys ending ``_mb`` in the package are PyTorch's own option names (``bucket_cap_mb``,
    ``max_split_size_mb``, both in MiB but not ours to rename); everything proflab names in
    2^20-byte units ends ``_mib``; the schemas name no ``_mb`` key."""
    import re

    src = Path(proflab.__file__).parent
    found = set()
    for p in list(src.rglob("*.py")) + list(src.rglob("*.json")):
        found |= set(re.findall(r"\b(\w+_mb)\b", p.read_text()))
    assert found <= {"bucket_cap_mb", "max_split_size_mb"}, found
