"""Every event of a trace over the memory budget, in consecutive parts (``--all-parts``).

Each recorded trace is analysed twice: whole, and in parts under a budget that leaves room
for about a third of it; the combined report must say what the whole analysis says. Times,
counts, steps, copies, the kernels' totals and modes are exact; medians and percentiles are
within ``quantiles.ALPHA``; the findings are the same, with the same severities.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import proflab
from proflab.analysis import quantiles
from proflab.analysis.context import Context
from proflab.readers import budget as limits
from proflab.readers import kineto, load, load_parts, nsys_sqlite
from test_nsys_slicing import with_steps

HERE = Path(__file__).resolve().parent
from shared_fixtures import NSYS  # noqa: E402
KINETO = HERE / "data" / "kineto" / "train_loop.pt.trace.json.gz"
ALPHA = quantiles.ALPHA


def _nsys(name: str) -> Path:
    path = NSYS / f"{name}.sqlite"
    if not path.exists():
        pytest.skip("shared fixtures folder (../shared/fixtures/nsys) is absent")
    return path


def _export_budget(path: Path, share: float = 0.28) -> int:
    """A budget whose parts each hold about ``share`` of the export's events (of the whole
    analysis's memory beyond the fixed part), whatever share of the room a part fills."""
    need = limits.estimate(nsys_sqlite.table_rows(path))
    return int(limits.COST_FIXED + share * (need - limits.COST_FIXED) / limits.ALL_PARTS_MARGIN)


def _kineto_budget(path: Path, share: float = 0.4) -> int:
    whole = kineto.read(path)
    return int(limits.KINETO_PART_FIXED + share * limits.KINETO_PART_EVENT * (whole.gpu.height + whole.cpu.height) / limits.KINETO_PART_MARGIN)


def _close(a, b, rel: float = ALPHA, abs_: float = 0.011) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= rel * abs(b) + abs_


def _same_report(parts: dict, whole: dict, *, exact_idle: bool, causes_within: float = 0.005) -> None:
    """What the combined report must share with the whole analysis's (see the module doc)."""
    src = parts["source"]["inputs"][0]
    assert src["parts"] >= 2 and src["memory_budget_bytes"] > 0
    s, w = parts["summary"], whole["summary"]
    for key in ("wall_ms", "window_start_ns", "window_end_ns", "gpu_busy_pct", "breakdown_ms", "devices", "step_count",
                "median_step_ms", "median_cpu_step_ms", "step_spread_ms", "step_side", "memcpy_by_direction_ms"):
        assert s[key] == w[key], key
    if w["observer"] is not None:
        for key in ("steps", "gpu_step_ms", "gpu_work_ms", "events_per_step", "python_events_per_step", "launches_per_step"):
            assert s["observer"][key] == w["observer"][key], key
        assert _close(s["observer"]["host_work_ms"], w["observer"]["host_work_ms"], 0.01)
    assert parts["steps"] == whole["steps"]
    assert sorted(map(json.dumps, parts["memcpy"])) == sorted(map(json.dumps, whole["memcpy"]))
    assert [k["name"] for k in parts["kernels"]] == [k["name"] for k in whole["kernels"]]
    for a, b in zip(parts["kernels"], whole["kernels"], strict=True):
        for key in ("count", "total_ms", "max_us", "share_pct", "devices", "grid", "block", "registers", "op", "tensor_cores"):
            assert a[key] == b[key], (a["name"], key)
        assert _close(a["median_us"], b["median_us"]) and _close(a["mean_us"], b["mean_us"], 0, 0.011), a["name"]
    lp, lw = parts["launch"], whole["launch"]
    assert lp["kernels"] == lw["kernels"] and lp["kernels_under_5us_pct"] == lw["kernels_under_5us_pct"]
    assert lw["launch_calls"] <= lp["launch_calls"] <= lw["launch_calls"] + src["parts"]  # (a call across a cut: in both)
    for key in ("median_kernel_us", "median_launch_call_us", "median_launch_to_start_us", "p90_launch_to_start_us"):
        assert _close(lp[key], lw[key]), key
    assert lp["launches_per_step"] == lw["launches_per_step"]
    ip, iw = parts["idle"], whole["idle"]
    idle = sum(iw["by_cause_ms"].values())
    assert _close(sum(ip["by_cause_ms"].values()), idle, 0, 0.02)
    # (a time window's cut may fall inside a launch or sync call of a thread other than the
    # one it moved for: the gap after it then takes another cause, a few in a thousand)
    for cause, ms in iw["by_cause_ms"].items():
        assert _close(ip["by_cause_ms"][cause], ms, 0, 0.011 if exact_idle else max(0.02, causes_within * idle)), cause
    assert [(f["id"], f["severity"]) for f in parts["findings"]] == [(f["id"], f["severity"]) for f in whole["findings"]]
    for a, b in zip(parts["findings"], whole["findings"], strict=True):
        if a["category"] == "healthy":
            continue
        found, of = map(int, a["evidence"]["found_in_parts"].split(" of "))
        assert of == src["parts"] and a["evidence"]["part"]
        # each part's rule decides over its part: a finding under its floor in some parts has
        # only the others' gain (the T4 export's low utilisation: 52.4 of 54.2 ms)
        # and a gain that is not a sum (launch-bound: per-part medians) is a few percent off
        assert _close(a["est_gain_ms"], b["est_gain_ms"], 0.001 if exact_idle else 0.05, 0.02), a["id"]
    for a, b in zip(parts["ranges"], whole["ranges"], strict=True):
        assert (a["name"], a["device"], a["launches"]) == (b["name"], b["device"], b["launches"])
        # (a range across a cut counts in a part only where it launched work there)
        assert _close(a["gpu_ms"], b["gpu_ms"], 0, 0.011) and _close(a["host_ms"], b["host_ms"], 0.001 if exact_idle else 0.01)
    assert [m["signal"] for m in parts["missing"]] == [m["signal"] for m in whole["missing"]]
    said = [n for n in parts["notes"] if n.startswith("memory budget: analysed every event in ")]
    assert len(said) == 1 and f" {src['parts']} consecutive parts " in said[0]


def _both(path: Path, budget: int) -> tuple[dict, dict]:
    parts = proflab.analyze(path, all_parts=True, memory_budget=budget, cache=False).to_dict()
    whole = proflab.analyze(load(path, cache=False, budget=None)).to_dict()
    return parts, whole


@pytest.mark.parametrize("name", ["h100_2gpu_1s", "mfu_2gpu_after", "mfu_2gpu_before", "t4_power_iteration_baseline"])
def test_an_export_analysed_in_time_windows_reports_what_its_whole_analysis_reports(name):
    """Exports without profiler steps are cut into time windows by launch: the H100 one's host
    runs 0.4 s ahead of its GPU (a part's work runs in the next part's time), the MFU ones are
    two processes with NCCL beside compute, the T4 one is sync-bound."""
    path = _nsys(name)
    parts, whole = _both(path, _export_budget(path))
    _same_report(parts, whole, exact_idle=False)
    cut = next(n for n in parts["notes"] if n.startswith("memory budget: analysed every event in "))
    assert cut.split("(")[1].startswith("window 0ms:")


@pytest.mark.parametrize("name", ["h100_2gpu_1s", "mfu_2gpu_before"])
def test_an_export_with_steps_is_analysed_in_whole_steps(name, tmp_path):
    """(The H100 export's host runs 0.4 s, eight of these steps, ahead of its GPU: the sync
    that owns a gap there is a later part's host call, which the part does not hold, so two
    of its sync gaps, 0.23 of 4.0 ms of idle, take another cause.)"""
    stepped = with_steps(_nsys(name), tmp_path / f"{name}.sqlite", n=20, first=0)
    parts, whole = _both(stepped, _export_budget(stepped))
    deep = name == "h100_2gpu_1s"
    _same_report(parts, whole, exact_idle=not deep, causes_within=0.1 if deep else 0.005)
    cut = next(n for n in parts["notes"] if n.startswith("memory budget: analysed every event in "))
    assert "(steps 0:" in cut and parts["summary"]["step_count"] == 20
    # (parts of 7 and 8 steps: the rules' medians over so few are said to be a part's)
    assert any(n.startswith("analysed in parts of as few as ") for n in parts["notes"])


def test_a_kineto_trace_analysed_in_parts_reports_what_its_whole_analysis_reports():
    budget = _kineto_budget(KINETO)
    parts, whole = _both(KINETO, budget)
    _same_report(parts, whole, exact_idle=True)
    assert parts["source"]["inputs"][0]["parts"] == 3  # its three steps, one a part


def test_steps_longer_than_a_part_leave_time_windows_and_say_so(tmp_path):
    """Two steps of half the export each: no step fits a part, so the parts are time windows,
    the steps across their cuts are in no part's step table, and the report says so (and
    does not call the steps missing)."""
    two = with_steps(_nsys("h100_2gpu_1s"), tmp_path / "two.sqlite", n=2, first=0)
    parts, whole = _both(two, _export_budget(two, 0.24))
    assert parts["source"]["inputs"][0]["parts"] >= 3 and whole["summary"]["step_count"] == 2
    assert "(window 0ms:" in next(n for n in parts["notes"] if n.startswith("memory budget: analysed every event in "))
    said = [n for n in parts["notes"] if "profiler steps run across a cut" in n]
    assert len(said) == 1 and said[0].startswith(f"{2 - parts['summary']['step_count']} of the trace's 2 ")
    assert "profiler steps" not in [m["signal"] for m in parts["missing"]]
    assert [k["name"] for k in parts["kernels"]] == [k["name"] for k in whole["kernels"]]


def test_a_trace_whose_whole_read_fits_is_analysed_whole():
    path = _nsys("h100_2gpu_1s")
    parts = proflab.analyze(path, all_parts=True, cache=False).to_dict()
    whole = proflab.analyze(path, cache=False).to_dict()
    assert parts == whole and "parts" not in parts["source"]["inputs"][0]


def test_every_gpu_activity_is_in_exactly_one_part(tmp_path):
    """By launch, never by time: the parts' GPU rows are the whole read's, each once (the H100
    export's work runs up to 0.4 s after its launch, across every cut)."""
    for path in (_nsys("h100_2gpu_1s"), with_steps(_nsys("mfu_2gpu_before"), tmp_path / "s.sqlite", n=20, first=0), KINETO):
        budget = _kineto_budget(path) if path == KINETO else _export_budget(path)
        got = [t.gpu.select("device", "stream", "start_ns", "dur_ns", "correlation") for t in load_parts(path, budget=budget)]
        assert len(got) >= 2
        whole = load(path, cache=False, budget=None).gpu.select("device", "stream", "start_ns", "dur_ns", "correlation")
        every = pl.concat(got)
        assert every.height == whole.height and every.sort(every.columns).equals(whole.sort(whole.columns))


def test_the_parts_meet_and_say_where_the_next_part_starts():
    path = _nsys("h100_2gpu_1s")
    parts = list(load_parts(path, budget=_export_budget(path)))
    for a, b in zip(parts, parts[1:]):
        first = b.gpu.group_by("device").agg(pl.col("start_ns").min())
        said = {w.device: w.start_ns for w in a.meta.next_part_work}
        assert said == dict(first.iter_rows())
        launched = {w.device: w.launch_start_ns for w in a.meta.next_part_work}
        assert all(v is not None for v in launched.values())
    assert parts[-1].meta.next_part_work == ()


def test_window_cuts_fall_where_no_runtime_call_runs():
    """A sync-bound loop spends most of its host time inside synchronising calls: a cut inside
    one would leave its part a sync without its return. Cuts move to a runtime call's start."""
    path = _nsys("t4_power_iteration_baseline")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        calls = con.execute("SELECT start, end, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchall()
    finally:
        con.close()
    whole = load(path, cache=False, budget=None)
    origin = min(int(whole.gpu["start_ns"].min()), int(whole.cpu["start_ns"].min()))
    specs = [t.meta.notes[-1] for t in load_parts(path, budget=_export_budget(path))]
    cuts = [origin + round(float(n.split("window ")[1].split("ms:")[0]) * 1e6) for n in specs[1:]]
    assert cuts
    for t in cuts:
        assert not any(a < t - 1 < b for a, b, _ in calls), t  # (the text keeps ns to 1e-6 ms)


def test_quantiles_from_merged_counts_are_within_their_error():
    rng = np.random.default_rng(7)
    values = pl.Series(rng.lognormal(9, 2, 200_001).astype(np.int64))
    pieces = [quantiles.sketch(values[i:i + 50_000]) for i in range(0, values.len(), 50_000)]
    merged = quantiles.merge(pieces)
    for q in (0.1, 0.5, 0.9):
        exact = values.quantile(q, "linear")
        assert abs(quantiles.quantile(merged, q) - exact) <= ALPHA * exact
    assert abs(quantiles.quantile(merged, 0.9, interpolation="nearest") - values.quantile(0.9)) <= ALPHA * values.quantile(0.9)
    assert quantiles.quantile(quantiles.sketch(pl.Series([5, 9])), 0.5) == pytest.approx(7.0, rel=ALPHA)
    assert quantiles.quantile(quantiles.sketch(pl.Series([-3, 0, 0, 1])), 0.5) == 0.0
    assert quantiles.quantile(quantiles.empty(), 0.5) is None


def test_the_cli_analyses_every_event_and_refuses_a_part_with_it(tmp_path, capsys):
    from proflab.cli import main

    path = _nsys("mfu_2gpu_after")
    budget = _export_budget(path)
    out = tmp_path / "r.json"
    rc = main(["analyze", str(path), "--all-parts", "--memory-budget", str(budget), "--no-cache", "-f", "json", "-o", str(out)])
    assert rc in (0, 1)
    report = json.loads(out.read_text())
    assert report["source"]["inputs"][0]["parts"] >= 2
    assert f"proflab: wrote {out} (" in capsys.readouterr().err  # (said where; the refusals below are one line each)
    for extra in (["--steps", "1:3"], ["--window", "0:10"], ["--perfetto", str(tmp_path / "p.json.gz")]):
        assert main(["analyze", str(path), "--all-parts", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--all-parts" in err and "Traceback" not in err


def test_a_reports_cached_all_parts_analysis_is_not_a_sampled_ones(tmp_path, monkeypatch):
    """The report cache keys --all-parts apart: a part from the middle and every event are
    different reports of the same file."""
    from proflab.cli import main

    monkeypatch.setenv("PROFLAB_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "m.sqlite"
    shutil.copyfile(_nsys("mfu_2gpu_after"), path)
    budget = str(_export_budget(path))
    got = {}
    for flags in ([], ["--all-parts"], []):
        out = tmp_path / "r.json"
        assert main(["analyze", str(path), "--memory-budget", budget, *flags, "-f", "json", "-o", str(out)]) in (0, 1)
        got.setdefault(tuple(flags), []).append(json.loads(out.read_text())["source"]["inputs"][0])
    assert "parts" not in got[()][0] and got[()][0] == got[()][1]
    assert got[("--all-parts",)][0]["parts"] >= 2


def test_all_parts_in_a_fresh_interpreter_holds_the_budget(tmp_path):
    """The peak of ``--all-parts`` follows one part: the 2.3 MB H100 export's parts at a
    budget that leaves a third of its events room each, in a child process."""
    from peak_rss import analyze_peak

    path = _nsys("h100_2gpu_1s")
    budget = _export_budget(path)
    rc, peak, err = analyze_peak(path, tmp_path / "r.json", "--all-parts", "--memory-budget", str(budget))
    assert rc in (0, 1), err
    assert json.loads((tmp_path / "r.json").read_text())["source"]["inputs"][0]["parts"] >= 2
    assert peak <= budget, f"{peak / 1e6:.0f} MB over the budget of {budget / 1e6:.0f} MB"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", __file__]))


REALISTIC = sorted((HERE / "data" / "realistic").glob("*.pt.trace.json.[gx]z"))


@pytest.mark.parametrize("path", REALISTIC, ids=[p.name.split(".pt.")[0] for p in REALISTIC])
def test_the_recorded_loops_in_parts_of_two_steps_keep_their_verdict(path):
    """The realistic H100 loops (four steps each, their unprofiled step times recorded beside
    them) in parts of about two steps: the verdict, the most severe finding and its severity,
    is the whole analysis's (a loop with none over info level has none in parts either), and
    the totals are exact. (The rules decide over each part: a
    finding under its floor in each part, the bf16 LM's 2.2 ms of unexplained idle, is absent
    from the combined report, and the notes say the parts hold few steps.)"""
    parts = proflab.analyze(path, all_parts=True, memory_budget=_kineto_budget(path, 0.6), cache=False).to_dict()
    whole = proflab.analyze(load(path, cache=False, budget=None)).to_dict()
    rank = {"critical": 0, "warning": 1, "info": 2}
    top = lambda r: min(((rank[f["severity"]], -f["est_gain_ms"], f["id"]) for f in r["findings"]), default=None)  # noqa: E731
    if top(whole)[0] < rank["info"]:
        assert top(parts)[0::2] == top(whole)[0::2]
    else:  # no warning: none in parts either (which info notes come first may differ)
        assert top(parts)[0] == rank["info"]
    for key in ("wall_ms", "gpu_busy_pct", "breakdown_ms", "step_count", "median_step_ms"):
        assert parts["summary"][key] == whole["summary"][key], key
    assert parts["steps"] == whole["steps"]
    if parts["source"]["inputs"][0].get("parts", 1) > 1:
        assert any(n.startswith("analysed in parts of as few as ") for n in parts["notes"])


def test_a_run_directorys_energy_is_not_read_again_with_all_parts(capsys):
    """A run directory's energy section reads its traces' windows and steps: with --all-parts
    it would read them again past the budget, so the report says where to get it instead."""
    from proflab.cli import main

    run = next((HERE / "data" / "kineto" / "scaling" / "balanced" / "runs").glob("*/*-1gpu"))
    assert (run / "monitor.parquet").is_file()
    assert main(["analyze", str(run), "--all-parts", "--no-cache", "--width", "100"]) in (0, 1)
    out = capsys.readouterr().out
    assert "Energy: not analysed (not with --all-parts: proflab energy RUN_DIR analyses it)" in out


LONG = HERE / "data" / "realistic" / "long"


@pytest.mark.parametrize("share,count", [(0.4, 3), (0.08, 24)], ids=["3-parts", "a-step-a-part"])
@pytest.mark.parametrize("name", ["cnn_loader", "mlp_foreach"])
def test_recorded_loops_of_24_steps_in_parts_keep_their_verdicts(name, share, count):
    """Two realistic H100 loops of 24 profiled steps, with their measured unprofiled step time
    (as ``proflab run`` records it), in 3 parts of 8 steps and in 24 parts of one step: the
    findings, their severities and gains are the whole analysis's. The host-side gains are
    decided over all parts' sums with the whole trace's medians (a sum of per-part decisions
    read the DataLoader loop launch-bound in parts of one step, and gave it a 57 ms
    launch-bound warning in parts of 8), and a part reads the host spans of its gaps as the
    whole trace does: from each thread's last event in the parts before it (the autograd
    thread's idle since the step before) to the next part's first launch (the next batch's
    DataLoader fetch, at the next step's start)."""
    path = LONG / f"{name}.light.pt.trace.json.xz"
    bare = json.loads((LONG / "ground_truth.json").read_text())["loops"][name]["bare"]["median_ms"]
    parts = proflab.analyze(path, all_parts=True, memory_budget=_kineto_budget(path, share), cache=False, bare_step_ms=bare).to_dict()
    whole = proflab.analyze(load(path, cache=False, budget=None), bare_step_ms=bare).to_dict()
    assert parts["source"]["inputs"][0]["parts"] == count and parts["steps"] == whole["steps"]
    assert [(f["id"], f["severity"]) for f in parts["findings"]] == [(f["id"], f["severity"]) for f in whole["findings"]]
    for a, b in zip(parts["findings"], whole["findings"], strict=True):
        assert _close(a["est_gain_ms"], b["est_gain_ms"]) and _close(a["est_gain_pct"], b["est_gain_pct"]), a["id"]
    assert parts["summary"]["observer"]["source"] == "measured" and parts["summary"]["step_count"] == 24


def test_parts_shorter_than_a_step_say_the_profilers_cost_is_not_corrected():
    """Time windows shorter than a step hold no whole step: the observer model has none, the
    host-side gains are the observed idle (the launch-bound loop's 242 ms against 141 ms
    without the profiler), and the report says so where the gains are given, not that the
    trace has no steps."""
    path = LONG / "mlp_foreach.light.pt.trace.json.xz"
    bare = json.loads((LONG / "ground_truth.json").read_text())["loops"]["mlp_foreach"]["bare"]["median_ms"]
    parts = proflab.analyze(path, all_parts=True, memory_budget=_kineto_budget(path, 0.04), cache=False, bare_step_ms=bare).to_dict()
    assert parts["summary"]["step_count"] == 0 and parts["summary"]["observer"] is None
    assert any(n.startswith("the profiler's own cost is not estimated: no part holds a whole profiler step") for n in parts["notes"])
    launch = next(f for f in parts["findings"] if f["id"] == "launch_bound")
    assert launch["evidence"]["profiler_cost"].startswith("not estimated: no part holds a whole profiler step")


def test_a_part_holds_the_next_parts_host_events_up_to_its_first_launch(tmp_path):
    """``Trace.next_part_host``: the next part's host events, on the threads that launch its
    first work, that start from the part's end to that launch, the call included (or to an
    eighth of the part's span past its end, the first part's from its first step), and
    nothing else; none after the last part (a Kineto trace's parts read from disk, an
    export's from SQLite)."""
    stepped = with_steps(_nsys("mfu_2gpu_before"), tmp_path / "s.sqlite", n=20, first=0)
    path = LONG / "cnn_loader.light.pt.trace.json.xz"
    for got in (list(load_parts(path, budget=_kineto_budget(path, 0.15))), list(load_parts(stepped, budget=_export_budget(stepped)))):
        assert len(got) >= 3 and got[-1].next_part_host is None
        for a, b in zip(got, got[1:]):
            ahead = a.next_part_host
            end = b.steps["start_ns"].min()  # (whole steps: a part's host window starts at its first step)
            cap = end + (end - a.steps["start_ns"].min()) // 8 - 1
            until: dict[int, int] = {}
            for w in a.meta.next_part_work:
                until[w.tid] = max(until.get(w.tid, 0), min(w.launch_start_ns, cap))
            assert ahead.height and ahead.schema == a.cpu.schema
            on = pl.col("tid").replace_strict(until, default=None, return_dtype=pl.Int64)
            expect = b.cpu.filter((pl.col("start_ns") >= end) & (pl.col("start_ns") <= on))
            assert ahead.sort(ahead.columns).equals(expect.sort(expect.columns))


def test_what_a_part_reads_past_its_end_is_bounded():
    """A device idle long into the next part (its first work launched late) must not read
    that part in: each thread's reach past the part is at most an eighth of its span."""
    from proflab.model.slicing import SliceSpec, ahead_condition

    spec = SliceSpec(steps=(0, 4), ahead=((7, 1_500), (9, 1_010)))
    one, either = (lambda t, u: (t, u)), (lambda a, b: [*(a if isinstance(a, list) else [a]), b])
    assert ahead_condition(spec, 0, 1_000, one, either) == [(7, 1_125), (9, 1_010)]
    assert ahead_condition(SliceSpec(steps=(0, 4), ahead=((7, 900),)), 0, 1_000, one, either) is None  # (not past the end)
    assert ahead_condition(SliceSpec(steps=(0, 4)), 0, 1_000, one, either) is None
    assert ahead_condition(spec, -(2**62), 1_000, one, either) == [(7, 1_500), (9, 1_010)]  # (an open start: no span to bound by)
    assert ahead_condition(spec, -(2**62), 1_000, one, either, first=200) == [(7, 1_100), (9, 1_010)]  # (the first part: from its first step)


def test_two_traces_compared_in_parts_compare_as_their_whole_analyses():
    """``compare(..., all_parts=True)``: each trace analysed in parts of whole steps, its
    comparison tables summed over them (``report.compare.combined_part``): the step times,
    their interval, the verdict, where the time moved, kernels, operators and ranges are the
    whole traces' comparison's (the DataLoader-fed loop against the per-parameter one)."""
    a, b = LONG / "cnn_loader.light.pt.trace.json.xz", LONG / "mlp_foreach.light.pt.trace.json.xz"
    budget = min(_kineto_budget(a, 0.4), _kineto_budget(b, 0.4))
    parts = proflab.compare(a, b, all_parts=True, memory_budget=budget, cache=False)
    whole = proflab.compare(load(a, cache=False, budget=None), load(b, cache=False, budget=None))
    assert all(r.source["inputs"][0]["parts"] >= 2 for side in (parts.before, parts.after) for r in side.reports)
    p, w = parts.to_dict(), whole.to_dict()
    for key in ("verdict", "verdict_reason", "per", "step_time_ms", "gpu_work_ms", "breakdown_ms", "breakdown_delta_ms", "kernels",
                "ops", "ranges", "caveats"):
        assert p[key] == w[key], key
    assert [f["id"] for f in p["findings"]["new"]] == [f["id"] for f in w["findings"]["new"]]


def test_the_cli_compares_in_parts_from_the_report_cache_and_refuses_a_part(tmp_path, monkeypatch, capsys):
    """``compare --all-parts``: a second run is answered from the report cache, which keeps it
    apart from a comparison of a part from each trace's middle; --steps and --window, which
    take a part, are refused in one line."""
    from proflab.cli import main

    monkeypatch.setenv("PROFLAB_CACHE_DIR", str(tmp_path / "cache"))
    a, b = tmp_path / "a.pt.trace.json.xz", tmp_path / "b.pt.trace.json.xz"
    shutil.copyfile(LONG / "cnn_loader.light.pt.trace.json.xz", a)
    shutil.copyfile(LONG / "mlp_foreach.light.pt.trace.json.xz", b)
    budget = str(min(_kineto_budget(a, 0.4), _kineto_budget(b, 0.4)))
    got = []
    for flags in (["--all-parts"], [], ["--all-parts"]):
        out = tmp_path / "c.json"
        assert main(["compare", str(a), str(b), "--memory-budget", budget, *flags, "-f", "json", "-o", str(out)]) == 0
        got.append(json.loads(out.read_text()))
    assert got[0] == got[2] and got[0]["step_time_ms"]["steps_before"] == 24
    assert got[1]["step_time_ms"]["steps_before"] < 24  # a part from the middle
    assert capsys.readouterr().err.count(f"proflab: wrote {out} (") == 3  # each -o said where it went
    for extra in (["--steps", "1:3"], ["--window", "0:10"]):
        assert main(["compare", str(a), str(b), "--all-parts", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--all-parts" in err and "Traceback" not in err


def test_run_directories_compared_in_parts_say_their_energy_is_not_compared():
    """A run directory's energy per step reads its traces' windows and steps again, past the
    budget the parts hold: with all parts the comparison says it is not compared."""
    run = next((HERE / "data" / "kineto" / "scaling" / "balanced" / "runs").glob("*/*-1gpu"))
    parts = proflab.compare(run, run, all_parts=True, cache=False).to_dict()
    whole = proflab.compare(run, run, cache=False).to_dict()
    assert parts["verdict"] == whole["verdict"] and parts["step_time_ms"] == whole["step_time_ms"]
    assert any(c.startswith("energy per step: not compared with all parts") for c in parts["caveats"])
    assert whole["energy"] is not None and parts["energy"] is None


def _close_items(a: list[dict], b: list[dict], tol_ms: float = 2e-4) -> bool:
    """Overview items alike: the same fields, times within ``tol_ms`` (each part's are rounded
    to 0.1 us from its own window's start)."""
    key = lambda x: (x["lane"], x["start"])  # noqa: E731
    if len(a) != len(b):
        return False
    for x, y in zip(sorted(a, key=key), sorted(b, key=key)):
        if x.keys() != y.keys():
            return False
        for k in x:
            if isinstance(x[k], float) and isinstance(y[k], float) and abs(x[k] - y[k]) <= tol_ms:
                continue
            if x[k] != y[k]:
                return False
    return True


@pytest.mark.parametrize("name,share", [("cnn_loader", 0.15), ("mlp_foreach", 0.08)])
def test_the_timeline_combined_from_the_parts_is_the_whole_traces(name, share):
    """The HTML page's timeline of a trace analysed in parts of whole steps
    (``overview.combined_overview`` of each part's ``part_overview``): the whole trace's, its
    GPU work merged at the whole window's resolution with the same counts, busy times and
    longest kernels' names, the same idle gaps, steps and ranges (a range whose host time
    lies before its part's GPU-side window included), what is left out counted alike."""
    from proflab.analysis.overview import combined_overview, overview, part_overview
    from proflab.report.assemble import report_for
    from proflab.report.combine import report_in_parts

    path = LONG / f"{name}.light.pt.trace.json.xz"
    ctx = Context(load(path, cache=False, budget=None))
    report_for(ctx)
    whole = overview(ctx)
    views = []
    report_in_parts(load_parts(path, budget=_kineto_budget(path, share)), each=lambda c: views.append(part_overview(c)))
    assert len(views) >= 8
    got = combined_overview([(lo, v) for lo, _, v in views], min(v[0] for v in views), max(v[1] for v in views))
    assert (got["window_ms"], got["resolution_us"], got["lanes"], got["left_out"]) == (whole["window_ms"], whole["resolution_us"], whole["lanes"], whole["left_out"])
    for what in ("segments", "gaps", "steps", "ranges"):
        assert _close_items(got[what], whole[what]), what


def _page_charts(page: str) -> list:
    import re

    return json.loads(re.search(r'<script type="application/json" id="proflab-charts">(.*?)</script>', page, re.S).group(1))


def test_the_html_report_of_every_event(tmp_path, monkeypatch, capsys):
    """``report --all-parts`` (and ``analyze -o page.html --all-parts``): the page of a trace
    analysed in parts, its charts the whole trace's page's (times within 2 us), its summary the
    combined report's; a second run comes from the report cache; one page per trace file, and
    no part of it (--steps) with --all-parts."""
    from proflab.cli import main

    monkeypatch.setenv("PROFLAB_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "cnn.pt.trace.json.xz"
    shutil.copyfile(LONG / "cnn_loader.light.pt.trace.json.xz", path)
    budget = str(_kineto_budget(path, 0.15))
    pages = {}
    for name, argv in (("parts", ["report", str(path), "--all-parts", "--memory-budget", budget]),
                       ("again", ["report", str(path), "--all-parts", "--memory-budget", budget]),
                       ("analyze", ["analyze", str(path), "--all-parts", "--memory-budget", budget]),
                       ("whole", ["report", str(path), "--memory-budget", "none"])):
        out = tmp_path / f"{name}.html"
        assert main([*argv, "-o", str(out)]) in (0, 1)
        pages[name] = out.read_text()
    assert "analysed every event in 8 consecutive parts" in pages["parts"]
    charts = {k: _page_charts(v) for k, v in pages.items()}
    assert charts["parts"] == charts["again"] == charts["analyze"]
    for a, b in zip(charts["parts"], charts["whole"], strict=True):
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) or _close_specs(a, b)
    capsys.readouterr()
    for more, extra in (([], ["--steps", "5:9"]), ([str(LONG / "mlp_foreach.light.pt.trace.json.xz")], [])):
        assert main(["report", str(path), *more, "--all-parts", *extra, "-o", str(tmp_path / "x.html")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--all-parts" in err and "Traceback" not in err


def _close_specs(a, b, tol: float = 2e-3) -> bool:
    """Two chart specs alike but for numbers within ``tol`` (ms)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close_specs(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close_specs(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, (int, float)) or isinstance(b, float) and isinstance(a, (int, float)):
        return abs(a - b) <= tol
    return a == b


def test_the_page_of_a_run_directory_in_parts_says_its_energy_is_not_analysed(tmp_path):
    from proflab.cli import main

    run = next((HERE / "data" / "kineto" / "scaling" / "balanced" / "runs").glob("*/*-1gpu"))
    out = tmp_path / "run.html"
    assert main(["report", str(run), "--all-parts", "--no-cache", "-o", str(out)]) == 0
    page = out.read_text()
    assert "energy: not analysed with --all-parts" in page and "energy of the run (all GPUs)" not in page


@pytest.mark.parametrize("name,share", [("train_loop", 0.4), ("sync_every_step", 0.3)])
def test_the_parts_step_graphs_join_into_the_whole_traces(name, share, monkeypatch):
    """The what-if replays the parts' step graphs joined as one (``whatif.graph.concat``): its
    calls, operations and the host work before each call are the whole trace's graph's, to the
    event. ``train_loop``'s parts each hold the Python frames open across their cut (from the
    thread's start: once counted in the part after a seam, and in the part before); a stretch of
    ``sync_every_step``'s quiet host work crosses each cut (counted half in each part, once
    only in the part after it)."""
    from proflab.analysis.whatif import graph as whatif_graph
    from proflab.report import combine

    path = HERE / "data" / "kineto" / f"{name}.pt.trace.json.gz"
    joined = []
    real = combine.concat
    monkeypatch.setattr(combine, "concat", lambda *a, **k: joined.append(real(*a, **k)) or joined[-1])
    proflab.analyze(path, all_parts=True, memory_budget=_kineto_budget(path, share), cache=False)
    trace = load(path, cache=False, budget=None)
    whole = whatif_graph.build_graph(trace, Context(trace))
    (got,) = joined
    assert got.steps == whole.steps and got.n_calls == whole.n_calls
    for field in ("call_start", "call_dur", "call_kind", "call_step", "work", "work_events", "work_python",
                  "work_loader", "work_quiet", "op_start", "op_dur", "op_call", "op_dep"):
        assert np.array_equal(getattr(got, field), getattr(whole, field)), field
    assert whole.work_events.sum() > 0 and whole.work_quiet.sum() > 0 and (name != "train_loop" or whole.work_python.sum() > 0)
