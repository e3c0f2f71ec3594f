"""SQL over a distributed job's tables (``proflab sql RUN_DIR``, ``proflab.sql.query_job``),
on real rank traces: 2x H200 DDP over NCCL and a 2-process CPU DDP job (gloo) whose rank 1
sleeps 30 ms per step (see tests/test_job.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from proflab import sql
from proflab.report import job as jobs
from proflab.cli import main

DATA = Path(__file__).parent / "data"
DDP = DATA / "kineto" / "ddp"
RUN_DIR = DATA / "runs" / "20261122-082928-h200x2_ddp"
STRAGGLER = DATA / "kineto" / "gloo" / "straggler"


@pytest.fixture(scope="module")
def ddp() -> dict[str, pl.DataFrame]:
    return sql.job_tables(sorted(DDP.glob("*.gz")))


@pytest.mark.parametrize("name", list(sql.JOB_TABLES))
def test_every_job_table_round_trips_through_sql(ddp, name):
    want = ddp[name]
    assert want.height > 0, name
    got = sql.query_job(sorted(DDP.glob("*.gz")), f"SELECT * FROM {name}")
    assert got.schema == want.schema
    assert_frame_equal(got, want)


def test_empty_job_tables_have_the_real_columns_and_types(ddp):
    empty = sql.job_tables(None)
    assert list(empty) == list(sql.JOB_TABLES)
    for name, df in empty.items():
        real = ddp[name]
        # job_ranks adds one idle_<cause>_ms column per cause a GPU rank shows
        extra = [c for c in real.columns if c not in df.columns]
        assert all(c.startswith("idle_") and c.endswith("_ms") for c in extra), (name, extra)
        assert real.select(df.columns).schema == df.schema, name


def test_waits_split_each_collective_and_match_the_job_report(ddp):
    paths = sorted(DDP.glob("*.gz"))
    got = sql.query_job(
        paths,
        "SELECT rank, count(*) AS n, bool_and(wait_ns + transfer_ns = end_ns - start_ns) AS split, "
        "bool_and(exposed_transfer_ns <= transfer_ns AND exposed_wait_ns <= wait_ns) AS bounded "
        "FROM job_waits GROUP BY rank ORDER BY rank",
    )
    assert got["n"].to_list() == [15, 15] and got["split"].all() and got["bounded"].all()
    # the per-rank table is the job report's
    report = jobs.analyze_job(paths)
    ranks = sql.query_job(paths, "SELECT rank, comm_ms, wait_ms, exposed_transfer_ms, overlap_pct FROM job_ranks ORDER BY rank")
    for row, want in zip(ranks.to_dicts(), report.ranks):
        for k, v in row.items():
            assert v == pytest.approx(want[k], abs=1e-3), k
    # bus bandwidth of the large buckets, as the report's collective table has it
    big = sql.query_job(paths, "SELECT median(busbw_gbps) AS bw FROM job_collectives WHERE bytes > 1e6")["bw"][0]
    assert 100 < big < 450


def test_a_straggler_is_the_last_to_arrive(capsys):
    assert main(["sql", str(STRAGGLER), "SELECT last_rank, count(*) AS n, median(skew_ns) / 1e6 AS skew_ms "
                 "FROM job_collectives GROUP BY last_rank ORDER BY n DESC", "-f", "csv"]) == 0  # fmt: skip
    df = pl.read_csv(io.StringIO(capsys.readouterr().out))
    assert df["last_rank"][0] == 1 and df["skew_ms"][0] > 15  # rank 1 sleeps 30 ms per step
    # the CPU backend's calls carry no message sizes: null, not a guess
    assert main(["sql", str(STRAGGLER), "SELECT count(*) AS n, count(bytes) AS sized FROM rank_collectives", "-f", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["n"] > 0 and row["sized"] == 0


def test_run_directory_tables_and_catalog(capsys):
    assert main(["sql", str(RUN_DIR), "--tables", "--width", "80"]) == 0
    out = capsys.readouterr().out
    heads = [line.split(" ", 1)[0] for line in out.splitlines() if line and not line.startswith(" ")]
    assert heads == list(sql.JOB_TABLES)
    assert "job_ranks (2 rows)" in out
    assert main(["sql", str(RUN_DIR), "SELECT count(*) AS n FROM rank_collectives", "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["n"] > 0


def test_job_sql_bad_input_is_one_line(tmp_path, capsys):
    # two traces of no job (no ranks): one line, exit 2
    d = tmp_path / "two"
    d.mkdir()
    for name in ("a.json", "b.json"):
        (d / name).write_bytes((DATA / "kineto" / "gloo" / "single" / "rank0.pt.trace.json.gz").read_bytes())
    assert main(["sql", str(d), "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not one job" in err
    # an unknown table names the job's tables
    assert main(["sql", str(STRAGGLER), "SELECT * FROM kernels"]) == 2
    err = capsys.readouterr().err
    assert "job_waits" in err and len(err.strip().splitlines()) == 1
    # never written over a rank trace
    target = STRAGGLER / "rank0.pt.trace.json.gz"
    before = target.read_bytes()
    assert main(["sql", str(STRAGGLER), "SELECT 1 AS x", "-o", str(target), "-f", "csv"]) == 2
    assert target.read_bytes() == before
