"""The committed two-GPU DDP run directory (tests/data/runs/, recorded on 2x H200 under
torchrun): one trace per rank, the launcher not profiled, and `proflab analyze RUN_DIR`
reading every rank."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

import proflab
from proflab.cli import main

RUN = Path(__file__).resolve().parents[1] / "data" / "runs" / "20261122-082928-h200x2_ddp"


def test_torchrun_leaves_one_trace_per_rank_and_skips_the_launcher():
    meta = json.loads((RUN / "meta.json").read_text())
    assert meta["exit_status"] == 0 and meta["status"] == "finished"
    assert sorted(Path(t).name.split("_")[0] for t in meta["traces"]) == ["rank0", "rank1"]
    workers = [p for p in meta["processes"] if p["profiled"]]
    launcher = [p for p in meta["processes"] if not p["profiled"]]
    assert sorted(p["rank"] for p in workers) == ["0", "1"]
    assert all(p["steps"] == 30 and p["step_source"] == "optimizer" for p in workers)
    assert len(launcher) == 1 and launcher[0]["traces"] == []
    assert meta["monitor"]["energy_j"] > 0 and len(meta["monitor"]["devices"]) == 2


def test_each_rank_trace_has_its_own_device_and_nccl_all_reduces():
    for rank, trace_path in enumerate(sorted((RUN / "traces").glob("rank*.pt.trace.json.gz"))):
        trace = proflab.load(trace_path)
        assert trace.gpu["device"].unique().to_list() == [rank]
        comm = trace.gpu.filter(pl.col("is_comm"))
        assert comm.height > 0 and comm["name"].str.contains("AllReduce").all()


def test_analyze_the_run_directory_reports_every_rank(tmp_path):
    out = tmp_path / "report.json"
    assert main(["analyze", str(RUN), "-f", "json", "-o", str(out)]) in (0, 1)
    job = json.loads(out.read_text())  # the ranks of one job: the job report, each rank's inside
    assert job["schema"] == "proflab.job/1"
    reports = job["reports"]
    assert [r["source"]["distributed"]["rank"] for r in reports] == [0, 1]
    for rank, r in enumerate(reports):
        assert [d["device"] for d in r["summary"]["devices"]] == [rank]
        assert r["summary"]["breakdown_ms"]["communication"] > 0
        assert r["summary"]["step_count"] == 5
