"""Nsight Systems exports at scale: peak memory of `proflab analyze` on a generated export.

The export is the real 2x H100 export (../shared/fixtures/nsys) scaled up by
``benchmarks/gen_nsys.py`` to ~126 MB (1.7 M events: kernels, copies, runtime calls, NVTX
ranges). No timing asserts: times are in ``benchmarks/bench_nsys_large.py``; the memory bound
is what holds on any machine.

The bound is the interpreter and libraries (250 MiB) plus 150 bytes per event. What the
analysis holds per event was measured at 154 bytes (1 and 2 GB exports: 2,077 and 4,107 MiB);
at this size the peak was 412 MiB. A reader or analysis that keeps a second copy of the event
tables (~75 bytes per event) goes past it.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from peak_rss import analyze_peak

ROOT = Path(__file__).resolve().parent.parent
GEN = ROOT / "benchmarks" / "gen_nsys.py"
from shared_fixtures import NSYS  # noqa: E402

SOURCE = NSYS / "h100_2gpu_1s.sqlite"
EVENT_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")  # fmt: skip

BASE_MIB = 250
BYTES_PER_EVENT = 150


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    if not SOURCE.exists():
        pytest.skip("shared fixtures folder (../shared/fixtures/nsys) is absent")
    out = tmp_path_factory.mktemp("nsys_scale") / "big.sqlite"
    subprocess.run([sys.executable, str(GEN), str(SOURCE), str(out), "--size-mb", "100"], check=True, capture_output=True, timeout=300)
    return out


def _events(path: Path) -> int:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in EVENT_TABLES)
    finally:
        con.close()


def test_analyze_peak_rss_of_a_large_export_within_bound(export, tmp_path):
    n = _events(export)
    assert n > 1_500_000  # the export is the size the bound was set for
    out = tmp_path / "report.json"
    rc, peak, err = analyze_peak(export, out)
    assert rc in (0, 1), err  # 1: findings above the threshold, still a full report
    bound = BASE_MIB * 2**20 + BYTES_PER_EVENT * n
    assert peak <= bound, f"peak RSS {peak / 2**20:.0f} MiB > bound {bound / 2**20:.0f} MiB for {n:,} events"
    report = json.loads(out.read_text())
    assert report["source"]["inputs"][0]["events"] == n  # every event was read


def test_scaled_export_keeps_nvtx_texts_unique(export):
    """emit_nvtx's texts carry a running op id, so a real capture's are nearly all distinct (99 %
    in the source export); the generator renumbers each copy's op ids so a large export keeps
    that shape (verbatim copies repeated every text 100 times here, and hid a reader's cost per
    distinct text: 1.5 s more on a 1 GB export)."""
    con = sqlite3.connect(f"file:{export}?mode=ro", uri=True)
    try:
        rows, distinct, renumbered = con.execute(
            "SELECT count(text), count(DISTINCT text), sum(text GLOB '*op_id = [1-9]*0[0-9][0-9][0-9][0-9][0-9][0-9]') FROM NVTX_EVENTS"
        ).fetchone()
    finally:
        con.close()
    assert rows > 1_000_000 and distinct > 0.95 * rows
    assert renumbered > 0.9 * rows


def test_a_few_steps_of_a_large_export_read_only_those(export, tmp_path):
    """``--steps`` on the large export reads its part inside SQLite: the peak stays within the
    interpreter and libraries' allowance (250 MiB), where reading all 1.7 M events first and
    slicing after took 306 MiB (and analysing them all ~400)."""
    from test_nsys_slicing import with_steps

    stepped = with_steps(export, tmp_path / "stepped.sqlite", n=20)
    out = tmp_path / "report.json"
    rc, peak, err = analyze_peak(stepped, out, "--steps", "12:14")
    assert rc in (0, 1), err
    assert peak <= BASE_MIB * 2**20, f"peak RSS {peak / 2**20:.0f} MiB for two steps of 20"
    report = json.loads(out.read_text())
    assert "steps 12:14 (2 of 20 profiler steps)" in " ".join(report["notes"])
    assert report["source"]["inputs"][0]["events"] == _events(export) + 20


def test_an_export_over_the_memory_budget_is_analysed_within_it(export, tmp_path):
    """``--memory-budget 250M`` on the large export, whose whole analysis is estimated (and
    measured, above) to need more: the peak stays within the budget, and the report says
    what was analysed and how far it is like the whole export."""
    from proflab.readers import budget as limits
    from proflab.readers import nsys_sqlite

    budget = 250_000_000
    assert limits.estimate(nsys_sqlite.table_rows(export)) > 1.2 * budget
    out = tmp_path / "report.json"
    rc, peak, err = analyze_peak(export, out, "--memory-budget", "250M")
    assert rc in (0, 1), err
    assert peak <= budget, f"peak RSS {peak / 1e6:.0f} MB over the 250 MB budget"
    report = json.loads(out.read_text())
    notes = [n for n in report["notes"] if n.startswith("memory budget: ")]
    assert len(notes) == 2 and "over the budget of 250 MB" in notes[0] and "within" in notes[1]
    assert report["findings"]


def test_every_event_of_an_export_over_the_budget_is_analysed_within_it(export, tmp_path):
    """``--all-parts --memory-budget 250M`` on the large export: every event, in parts that
    each fit, within the budget (four parts: 191-193 MB measured with polars 2.1, 208-211 MB
    with 1.37; its whole analysis 370 MiB), and the report says what the whole analysis says
    (the findings, the breakdown, the kernels' totals)."""
    out = tmp_path / "parts.json"
    rc, peak, err = analyze_peak(export, out, "--all-parts", "--memory-budget", "250M")
    assert rc in (0, 1), err
    assert peak <= 250_000_000, f"peak RSS {peak / 1e6:.0f} MB over the 250 MB budget"
    parts = json.loads(out.read_text())
    whole_out = tmp_path / "whole.json"
    rc, _, err = analyze_peak(export, whole_out, "--memory-budget", "none")
    assert rc in (0, 1), err
    whole = json.loads(whole_out.read_text())
    assert parts["source"]["inputs"][0]["parts"] >= 2
    assert [(f["id"], f["severity"]) for f in parts["findings"]] == [(f["id"], f["severity"]) for f in whole["findings"]]
    for key in ("wall_ms", "gpu_busy_pct", "breakdown_ms", "memcpy_by_direction_ms"):
        assert parts["summary"][key] == whole["summary"][key], key
    assert [(k["name"], k["count"], k["total_ms"]) for k in parts["kernels"]] == [(k["name"], k["count"], k["total_ms"]) for k in whole["kernels"]]
