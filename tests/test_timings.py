"""``proflab analyze --timings``: each phase's wall time and peak memory (``proflab._timings``),
through ``main(argv)`` on a recorded trace, and the phase stack's arithmetic on its own."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from proflab._timings import PHASES, phase, recording
from proflab.cli import main

TRACE = Path(__file__).parent / "data" / "gains" / "gpt_char.base.pt.trace.json.gz"


def test_every_phase_of_an_analysis_is_timed_and_the_report_is_unchanged(tmp_path, capsys):
    plain, timed, timings = tmp_path / "plain.json", tmp_path / "timed.json", tmp_path / "t.json"
    assert main(["analyze", str(TRACE), "--no-cache", "-o", str(plain)]) == 0
    assert main(["analyze", str(TRACE), "--no-cache", "-o", str(timed), "--timings", str(timings)]) == 0
    assert plain.read_text() == timed.read_text()
    doc = json.loads(timings.read_text())
    rows = {r["phase"]: r for r in doc["phases"]}
    # a GPU trace with steps runs every phase (the memory phase looks for allocations even where there are none)
    assert [p for p in PHASES if p in rows] == list(PHASES)
    assert all(r["wall_s"] >= 0 for r in doc["phases"])
    assert sum(r["wall_s"] for r in doc["phases"]) == pytest.approx(doc["total_s"], abs=2e-3)
    if sys.platform.startswith("linux"):
        assert all(0 < rows[p]["peak_mib"] <= doc["peak_mib"] for p in PHASES)
        assert max(r["peak_mib"] for r in doc["phases"]) == doc["peak_mib"]  # the recording's peak is one of its stretches


def test_timings_alone_go_to_stderr(tmp_path, capsys):
    assert main(["analyze", str(TRACE), "--no-cache", "-f", "json", "--timings"]) == 0
    out, err = capsys.readouterr()
    json.loads(out)  # the report alone on stdout
    lines = err.strip().splitlines()
    assert lines[0].split()[:2] == ["phase", "wall"]
    assert [ln.split()[0] for ln in lines[1:]][: len(PHASES)] == list(PHASES) and lines[-1].startswith("total")


def test_a_phase_inside_another_is_its_own_time_not_the_outer_one_s():
    with recording() as t:
        with phase("rules"):
            time.sleep(0.02)
            with phase("what-if"):
                time.sleep(0.05)
                with phase("what-if"):  # (entered again inside itself: counted once)
                    time.sleep(0.01)
            time.sleep(0.02)
        with phase("what-if"):
            time.sleep(0.01)
    assert t.wall_s["what-if"] == pytest.approx(0.07, abs=0.015)
    assert t.wall_s["rules"] == pytest.approx(0.04, abs=0.015)
    assert sum(t.wall_s.values()) <= t.total_s


def test_without_a_recording_a_phase_measures_nothing():
    with phase("decode"):
        pass
    with recording() as t:
        pass
    assert t.wall_s == {} and all(r[0] == "other" for r in t.rows())


def test_a_trace_analysed_in_parts_times_its_reads_as_decode(tmp_path):
    """``--all-parts`` reads each part as the analysis asks for it: that read is the decode
    phase, and the parts' combination the timeline's (not left to ``other``)."""
    import subprocess

    trace, report, timings = tmp_path / "t.json", tmp_path / "r.json", tmp_path / "timings.json"
    gen = Path(__file__).resolve().parent.parent / "benchmarks" / "gen_realistic.py"
    subprocess.run([sys.executable, str(gen), str(trace), "--size-mb", "60"], check=True, capture_output=True, timeout=600)
    rc = main(["analyze", str(trace), "--all-parts", "--memory-budget", "250M", "--no-cache", "-o", str(report), "--timings", str(timings)])
    assert rc in (0, 1)
    assert json.loads(report.read_text())["source"]["inputs"][0]["parts"] >= 2
    rows = {r["phase"]: r["wall_s"] for r in json.loads(timings.read_text())["phases"]}
    assert rows["decode"] > rows.get("other", 0.0) and {"timeline", "what-if", "rules"} <= set(rows)
