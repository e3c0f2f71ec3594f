"""The Nsight Systems SQLite reader on real exports (../shared/fixtures/nsys): the same
diagnosis as from Kineto, and numbers that agree with direct SQL over the same file."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest

import proflab
from proflab.cli import main

from shared_fixtures import NSYS  # noqa: E402
T4 = NSYS / "t4_power_iteration_baseline.sqlite"
H100 = NSYS / "h100_2gpu_1s.sqlite"
ALL = sorted(NSYS.glob("*.sqlite")) if NSYS.exists() else []

pytestmark = pytest.mark.skipif(not NSYS.exists(), reason="shared fixtures folder (../shared/fixtures/nsys) is absent")


def _sql(path: Path, query: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("path", ALL, ids=[p.name for p in ALL])
def test_gpu_activity_agrees_with_direct_sql(path):
    trace = proflab.load(path)
    want = dict(_sql(path, "SELECT deviceId, SUM(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY deviceId"))
    got = dict(trace.kernels.group_by("device").agg(pl.col("dur_ns").sum()).iter_rows())
    assert got == want
    (n_copies,) = _sql(path, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY")[0]
    assert trace.memcpy.height == n_copies
    bytes_by_kind = dict(_sql(path, "SELECT copyKind, SUM(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY copyKind"))
    names = {1: "HtoD", 2: "DtoH", 8: "DtoD"}
    got_bytes = dict(trace.memcpy.group_by(pl.col("copy_kind").cast(pl.String)).agg(pl.col("bytes").sum()).iter_rows())
    for kind, total in bytes_by_kind.items():
        assert got_bytes[names[kind]] == total
    (n_runtime,) = _sql(path, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")[0]
    assert trace.cpu.filter(pl.col("cat") == "cuda_runtime").height == n_runtime


@pytest.mark.parametrize("path", ALL, ids=[p.name for p in ALL])
def test_every_kernel_finds_the_call_that_launched_it_in_its_own_process(path):
    """Correlation ids repeat across processes; the model's must not."""
    trace = proflab.load(path)
    calls = trace.cpu.filter(pl.col("cat").is_in(["cuda_runtime", "cuda_driver"])).select("correlation", "pid")
    assert calls["correlation"].is_unique().all()
    joined = trace.kernels.join(calls, on="correlation", how="left")
    matched = joined.filter(pl.col("pid").is_not_null())
    assert matched.height > 0
    assert ((matched["correlation"] // (1 << 32)) == matched["pid"]).all()
    # The exports are cut to a window: kernels with no call were launched before it began,
    # i.e. their per-process correlation id precedes every call the window holds.
    first_call = calls.group_by(pl.col("correlation") // (1 << 32)).agg(pl.col("correlation").min().alias("first"))
    orphans = joined.filter(pl.col("pid").is_null()).with_columns((pl.col("correlation") // (1 << 32)).alias("p"))
    orphans = orphans.join(first_call.rename({"correlation": "p"}), on="p", how="left")
    assert (orphans["correlation"] < orphans["first"]).all()


def test_t4_power_iteration_finds_pageable_async_copies_and_the_syncs():
    report = proflab.analyze(T4)
    by_cat = {f.category: f for f in report.findings}
    assert "pageable_memcpy" in by_cat
    assert by_cat["pageable_memcpy"].evidence["async_calls_made_synchronous"] == 89
    assert report.findings[0].category == "sync_bound"
    assert report.device["name"] == "Tesla T4" and report.device["sm_count"] == 40
    (dir_row,) = [m for m in report.memcpy if m["direction"] == "DtoH"]
    assert dir_row["memory"] == "Device -> Pageable" and dir_row["count"] == 89


def test_two_gpu_export_gives_a_breakdown_per_device():
    report = proflab.analyze(H100)
    devices = report.summary["devices"]
    assert [d["device"] for d in devices] == [0, 1]
    for d in devices:
        total = sum(d["breakdown_ms"].values())
        assert total == pytest.approx(report.summary["wall_ms"], abs=0.005)
    assert sum(report.idle["by_cause_ms"].values()) == pytest.approx(report.summary["breakdown_ms"]["idle"], abs=0.005)
    assert report.device == {"name": None}
    assert any("TARGET_INFO_GPU" in n for n in report.notes)


def test_nvtx_ranges_and_os_runtime_calls_are_read():
    trace = proflab.load(T4)
    (n_ranges,) = _sql(T4, "SELECT COUNT(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL")[0]
    assert trace.cpu.filter(pl.col("cat") == "user_annotation").height == n_ranges
    (n_osrt,) = _sql(T4, "SELECT COUNT(*) FROM OSRT_API")[0]
    assert trace.cpu.filter(pl.col("cat") == "os_runtime").height == n_osrt
    names = set(trace.cpu.filter(pl.col("cat") == "cuda_runtime")["name"].unique())
    assert "cudaMemcpyAsync" in names and not any("_v3020" in n for n in names)


def test_emit_nvtx_ranges_are_named_by_their_operator():
    trace = proflab.load(NSYS / "mfu_2gpu_before.sqlite")
    names = trace.cpu.filter(pl.col("cat") == "user_annotation")["name"]
    assert not names.str.contains(r", seq = ").any()
    assert (names == "aten::addmm").any()


def test_sqlite_that_is_not_an_nsys_export(tmp_path, capsys):
    path = tmp_path / "other.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x INTEGER)")
    con.commit()
    con.close()
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert "not an Nsight Systems export" in err and len(err.strip().splitlines()) == 1


def test_truncated_export_is_one_clear_line(tmp_path, capsys):
    path = tmp_path / "cut.sqlite"
    path.write_bytes(T4.read_bytes()[: 200_000])
    before = path.read_bytes()
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cut.sqlite" in err and "Traceback" not in err
    assert path.read_bytes() == before


def test_nsys_rep_without_nsys_says_how_to_convert(tmp_path, capsys, monkeypatch):
    if shutil.which("nsys"):
        pytest.skip("nsys is installed here: the conversion would run")
    path = tmp_path / "run.nsys-rep"
    path.write_bytes(b"\x00" * 64)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert "nsys export --type sqlite" in err and len(err.strip().splitlines()) == 1


def test_nvtx_domain_prefixes_range_names():
    """The T4 export has ranges in the CCCL domain (eventType 75 names it) and in the default one."""
    trace = proflab.load(T4)
    names = trace.cpu.filter(pl.col("cat") == "user_annotation")["name"]
    (in_domain,) = _sql(T4, "SELECT COUNT(*) FROM NVTX_EVENTS WHERE domainId = 1 AND eventType IN (59, 60) AND end IS NOT NULL")[0]
    assert names.str.starts_with("CCCL:").sum() == in_domain > 0


def test_emit_nvtx_operator_ranges_are_dispatch_not_host_work():
    """emit_nvtx writes every operator as an NVTX range; one that launches nothing
    (aten::view, aten::empty_strided) is the framework's dispatch, as Kineto's cpu_op is,
    never "host work that launches nothing" to move off the critical path."""
    from proflab.analysis.context import Context

    path = NSYS / "mfu_2gpu_after.sqlite"
    trace = proflab.load(path)
    ops = trace.cpu.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.starts_with("aten::"))
    assert ops.height > 1000  # the export's operators are NVTX ranges
    spans = Context(trace).host_only
    assert spans.height and not spans["name"].str.contains("::").any()
    host_bound = [f for f in proflab.analyze(path).findings if f.category == "host_bound"]
    assert not [op for f in host_bound for op in f.where.get("ops", []) if "::" in op]
