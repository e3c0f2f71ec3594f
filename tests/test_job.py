"""The job report across ranks, on real rank traces: a 2x H200 DDP run directory (NCCL,
balanced, communication partly under backward), 2x H200 DDP traces, and a 2-process CPU
DDP run (gloo) with a planted straggler (rank 1 sleeps 30 ms per step) recorded by
tests/data/record/record_gloo.py."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from proflab.report import job as jobs
from proflab.analysis.context import Context
from proflab.analysis.ranks import bus_factor, job_tables, link_reference, normalize_collective, rank_summary
from proflab.api import load
from proflab.cli import main
from proflab.report import JOB_SCHEMA_ID, JobReport

DATA = Path(__file__).parent / "data"
RUN_DIR = DATA / "runs" / "20261122-082928-h200x2_ddp"
DDP = [DATA / "kineto" / "ddp" / f"ddp_rank{r}.pt.trace.json.gz" for r in (0, 1)]
GLOO = DATA / "kineto" / "gloo"
STRAGGLER = [GLOO / "straggler" / f"rank{r}.pt.trace.json.gz" for r in (0, 1)]


@pytest.fixture(scope="module")
def run_job() -> JobReport:
    return jobs.analyze_job(sorted((RUN_DIR / "traces").iterdir()))


@pytest.fixture(scope="module")
def straggler() -> JobReport:
    return jobs.analyze_job(STRAGGLER)


def _summaries(paths):
    return [rank_summary(Context(load(p)), r) for r, p in enumerate(paths)]


def test_comms_table_reads_record_param_comms():
    t = load(DDP[0], cache=False)
    c = t.comms
    assert c.height == 15
    assert set(c["collective"]) == {"allreduce"} and set(c["dtype"]) == {"Float"}
    assert set(c["group"]) == {"0"} and set(c["group_size"]) == {2}
    # every NCCL kernel of the window carries the external id of its record_param_comms
    k = t.gpu.filter(pl.col("is_comm"))
    assert k.join(c, on="external_id", how="inner").height == k.height


def test_balanced_run_directory_gets_no_job_warning(run_job):
    d = run_job.to_dict()
    assert d["schema"] == JOB_SCHEMA_ID
    assert [r["rank"] for r in d["ranks"]] == [0, 1]
    assert d["summary"]["collectives_matched"] >= 10
    assert d["summary"]["skew_median_ms"] < 0.1  # both ranks reach the all-reduces together
    assert not [f for f in d["findings"] if f["severity"] in ("warning", "critical")]
    sized = [c for c in d["collectives"] if c["bytes"]]
    # 33,558,528 fp32 elements per bucket: 134,234,112 bytes
    assert 134_234_112 in {c["bytes"] for c in sized}
    for c in sized:  # a real NVLink all-reduce: fast, but below the link's datasheet figure
        assert 100 < c["busbw_gbps"] < d["link"]["gbps_per_direction"]
    for r in d["ranks"]:
        assert 0 <= r["exposed_transfer_ms"] <= r["transfer_ms"] <= r["comm_ms"] + 1e-6
        assert 0 < r["overlap_pct"] < 100
    assert len(run_job.reports) == 2


def test_straggler_is_named_with_its_cause(straggler):
    planted_ms = json.loads((GLOO / "bare_steps.json").read_text())["straggler"]["straggler_ms"]
    f = {x.category: x for x in straggler.findings}
    li = f["load_imbalance"]
    assert li.evidence["slow_rank"] == 1 and li.where["ranks"] == [1]
    assert li.evidence["cause"] == "host"
    assert 0.8 * planted_ms <= li.evidence["late_per_step_ms"] <= 1.3 * planted_ms
    assert 0.8 * planted_ms <= li.evidence["slow_host_ms_per_step"] <= 1.3 * planted_ms
    assert li.severity == "critical"
    # counted once for the job: never more than the window, though rank 0 waited twice per
    # step (two buckets) for the same delay
    assert li.est_gain_ms < straggler.summary["wall_ms"]
    assert li.evidence["others_wait_ms"]["0"] > li.est_gain_ms
    # the waiting rank's collective time is the straggler's cost, not communication's
    assert "communication_bound" not in f
    r0 = next(r for r in straggler.ranks if r["rank"] == 0)
    assert r0["wait_ms"] > 5 * r0["transfer_ms"]


def test_the_bare_loop_confirms_the_straggler():
    """Unprofiled, in the same processes: both ranks' steps carry rank 1's sleep."""
    bare = json.loads((GLOO / "bare_steps.json").read_text())["straggler"]
    for r in bare["ranks"]:
        med = sorted(r["bare_step_ms"])[len(r["bare_step_ms"]) // 2]
        assert med > bare["straggler_ms"]


def test_matching_leaves_out_what_is_not_on_every_rank():
    s = _summaries(STRAGGLER)
    whole = job_tables(s)
    first = s[1].calls.sort("start_ns").head(1)
    cut = s[1].calls.join(first, on=["group", "step", "seq"], how="anti")
    from dataclasses import replace

    t = job_tables([s[0], replace(s[1], calls=cut)])
    assert t.collectives.height == whole.collectives.height - 1
    assert any("not on every rank" in n for n in t.notes)


def test_ddp_traces_split_wait_and_transfer():
    t = job_tables(_summaries(DDP))
    w = t.waits
    assert w.height == 30  # 15 collectives on each of 2 ranks
    assert (w["wait_ns"] >= 0).all() and (w["transfer_ns"] >= 0).all()
    assert ((w["wait_ns"] + w["transfer_ns"]) == (w["end_ns"] - w["start_ns"])).all()
    # at each collective one rank (the last to arrive) does not wait
    assert (w.group_by("group", "step", "seq").agg(pl.col("wait_ns").min())["wait_ns"] == 0).all()


def test_collective_names_and_bus_factors():
    assert normalize_collective("all_reduce") == "allreduce"
    assert normalize_collective("AllReduce") == "allreduce"
    assert normalize_collective("_allgather_base") == "allgather"
    assert normalize_collective("reduce_scatter_tensor_coalesced") == "reducescatter"
    assert bus_factor("allreduce", 2) == 1.0 and bus_factor("allreduce", 8) == 1.75
    assert bus_factor("allgather", 4) == 0.75 and bus_factor("barrier", 4) is None
    assert link_reference("NVIDIA H200")["gbps_per_direction"] == 450
    assert link_reference("NVIDIA H100 PCIe")["link"].startswith("PCIe")
    assert link_reference("Some GPU") is None


def test_cli_job_report_every_format(tmp_path, capsys):
    assert main(["analyze", str(RUN_DIR), "-f", "json", "-o", str(tmp_path / "job.json")]) == 0
    d = json.loads((tmp_path / "job.json").read_text())
    assert d["schema"] == JOB_SCHEMA_ID and len(d["reports"]) == 2
    assert main(["analyze", *map(str, STRAGGLER), "-f", "md"]) == 0
    md = capsys.readouterr().out
    assert "# proflab job report" in md and "*load_imbalance*" in md and "## Rank 1" in md
    assert main(["analyze", *map(str, STRAGGLER)]) == 0
    term = capsys.readouterr().out
    assert "Rank 1 is the straggler" in term and "── rank 0 ──" in term


def test_cli_no_job_and_not_a_job(capsys):
    assert main(["analyze", *map(str, STRAGGLER), "--no-job", "-f", "json"]) == 0
    assert [d["schema"] for d in json.loads(capsys.readouterr().out)] == ["proflab.report/1"] * 2
    # the same rank twice is not one job: each trace gets its own report
    assert main(["analyze", str(STRAGGLER[0]), str(STRAGGLER[0]), "-f", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2
    assert main(["analyze", *map(str, STRAGGLER), "--workers", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_dask_gives_the_same_job_report(straggler):
    pytest.importorskip("dask.distributed", reason="the job extra (dask[distributed]) is not installed")
    on_dask = jobs.analyze_job(STRAGGLER, workers=2)
    # the engine says how the ranks were read: the budget holds each rank's read
    assert on_dask.summary["engine"] == "Dask LocalCluster, 2 worker process(es), each rank read within the 1.5 GB memory budget"
    assert on_dask.ranks == straggler.ranks
    assert [f.to_dict() for f in on_dask.findings] == [f.to_dict() for f in straggler.findings]


def test_balanced_gloo_job_names_no_straggler():
    """The same loop without the sleep: arrival jitter on a shared 2-core machine is not a
    straggler (it is within the spread of the collectives' end times)."""
    paths = [GLOO / "balanced" / f"rank{r}.pt.trace.json.gz" for r in (0, 1)]
    job = jobs.analyze_job(paths)
    assert "load_imbalance" not in {f.category for f in job.findings}
    assert job.summary["collectives_matched"] == 12


def test_scaling_weak_one_to_two_ranks(tmp_path, capsys):
    """1 process against 2 (gloo, same batch per process): the profiled efficiency agrees
    with the bare step times recorded beside the traces."""
    single = GLOO / "single" / "rank0.pt.trace.json.gz"
    plot = tmp_path / "scaling.png"
    assert main(["scaling", "--mode", "weak", str(single), str(GLOO / "balanced"), "--plot", str(plot), "-f", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schema"] == "proflab.scaling/1" and [p["gpus"] for p in d["points"]] == [1, 2]
    two = d["points"][1]
    bare = json.loads((GLOO / "bare_steps.json").read_text())

    def med(xs):
        return sorted(xs)[len(xs) // 2]

    t1 = med(bare["single"]["ranks"][0]["bare_step_ms"])
    t2 = max(med(r["bare_step_ms"]) for r in bare["balanced"]["ranks"])
    assert abs(two["efficiency_pct"] - 100 * t1 / t2) < 20  # profiled vs unprofiled, a busy 2-core machine
    parts = two["exposed_comm_ms_per_step"] + two["imbalance_wait_ms_per_step"] + two["other_ms_per_step"]
    assert parts == pytest.approx(two["loss_ms_per_step"], abs=0.01)
    assert two["exposed_comm_ms_per_step"] > 0
    assert plot.stat().st_size > 1000 and plot.read_bytes()[:4] == b"\x89PNG"


def test_scaling_refuses_one_gpu_count(capsys):
    assert main(["scaling", "--mode", "strong", str(GLOO / "balanced"), str(GLOO / "straggler")]) == 2
    assert "at least two GPU counts" in capsys.readouterr().err


def test_job_and_scaling_json_follow_their_schemas(run_job, straggler):
    jsonschema = pytest.importorskip("jsonschema")
    schemas = Path(jobs.__file__).parent.parent / "schema"
    job_schema = json.loads((schemas / "job.schema.json").read_text())
    report_schema = json.loads((schemas / "report.schema.json").read_text())
    for job in (run_job, straggler):
        d = json.loads(json.dumps(job.to_dict(), default=str))
        jsonschema.validate(d, job_schema)
        for r in d["reports"]:
            jsonschema.validate(r, report_schema)
    from proflab.report.scaling import point_of, scaling_rows
    from proflab.report import ScalingReport

    rows = scaling_rows([point_of("a", run_job), point_of("b", run_job.reports[0])], "strong")
    jsonschema.validate(ScalingReport("strong", tuple(rows)).to_dict(), json.loads((schemas / "scaling.schema.json").read_text()))


def test_dask_scheduler_address():
    """--scheduler: the tasks go to the cluster at that address (here a local one)."""
    dd = pytest.importorskip("dask.distributed", reason="the job extra (dask[distributed]) is not installed")
    with dd.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        job = jobs.analyze_job(STRAGGLER, scheduler=cluster.scheduler_address)
    assert job.summary["engine"] == f"Dask cluster at {cluster.scheduler_address}"
    assert job.findings[0].category == "load_imbalance"


from shared_fixtures import NSYS  # noqa: E402


@pytest.mark.skipif(not (NSYS / "mfu_2gpu_before.sqlite").exists(), reason="the shared Nsight Systems fixtures are not here")
def test_an_nsys_export_of_two_processes_is_one_job(capsys):
    """A real 2x H100 Nsight Systems export holds both ranks' processes: split by process,
    matched by order (no profiler steps), point-to-point collectives from the kernel names."""
    assert main(["analyze", str(NSYS / "mfu_2gpu_before.sqlite"), "-f", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schema"] == JOB_SCHEMA_ID and [r["rank"] for r in d["ranks"]] == [0, 1]
    assert d["collectives"][0]["collective"] == "sendrecv" and d["collectives"][0]["count"] == 33
    assert d["collectives"][0]["bytes"] is None  # the export has no collective metadata: missing, not zero
    assert any("GPU index" in n for n in d["notes"])
    # one outlier collective in a step-less trace is not a straggler
    assert "load_imbalance" not in {f["category"] for f in d["findings"]}
    for r in d["ranks"]:
        assert r["wait_ms"] + r["transfer_ms"] == pytest.approx(r["comm_ms"], abs=0.01)
    # a single-process export stays a plain report
    assert main(["analyze", str(NSYS / "h100_2gpu_1s.sqlite"), "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == "proflab.report/1"


def test_ddp_traces_exposed_allreduce_and_an_unconfirmed_straggler():
    """The 2x H200 DDP traces (fp32 gradients, 64 MiB buckets): most all-reduce time runs
    after backward's compute, so it is exposed; rank 0's GPU waits longer for its host,
    which its own observer says the profiler may explain: no gain claimed for that."""
    job = jobs.analyze_job(DDP)
    f = {x.id: x for x in job.findings}
    cb = f["communication_bound"]
    assert cb.evidence["collectives"] == ["allreduce"] and cb.evidence["dtypes"] == ["Float"]
    assert 200 < cb.evidence["busbw_gbps"] < cb.evidence["link_gbps_per_direction"] == 450
    assert cb.est_gain_ms <= cb.evidence["exposed_transfer_ms"]
    assert "bf16_compress_hook" in cb.fix and "gradient_as_bucket_view" in cb.fix
    li = f["load_imbalance_unconfirmed"]
    assert li.severity == "info" and li.est_gain_ms == 0 and li.evidence["cause"] == "dispatch"
    assert "load_imbalance" not in f


def test_per_rank_table_and_collectives_hold_what_the_job_report_promises(run_job):
    """GPU-side step, compute, exposed communication, idle by cause per rank; collectives
    with their wait skew and bus bandwidth against the link."""
    for r in run_job.ranks:
        assert r["step_side"] == "gpu" and r["step_ms"] > 0 and r["compute_ms"] > 0
        assert 0 <= r["exposed_wait_ms"] <= r["wait_ms"] and 0 <= r["exposed_transfer_ms"] <= r["transfer_ms"]
        causes = {k: v for k, v in r.items() if k.startswith("idle_") and k != "idle_ms"}
        assert causes and sum(causes.values()) == pytest.approx(r["idle_ms"], abs=0.01)
        assert r["bare_step_ms"] is None  # this run directory predates per-process step times: missing, not guessed
    peak = run_job.link["gbps_per_direction"]
    for c in run_job.collectives:
        assert c["skew_median_ms"] >= 0 and c["skew_max_ms"] >= c["skew_median_ms"]
        if c["busbw_gbps"] is None:  # no bytes, or no transfer after the last arrival
            assert c["busbw_of_link_pct"] is None
        else:
            assert c["busbw_of_link_pct"] == pytest.approx(100 * c["busbw_gbps"] / peak, abs=0.01)
    assert any(c["busbw_of_link_pct"] for c in run_job.collectives)
    from proflab.render import render

    text = render(run_job, "term", width=80)
    assert "% link" in text and "exp.wait" in text and "GPU-side" in text
    assert "GPU idle by cause" in text
    md = render(run_job, "md")
    assert "% link" in md and "GPU idle by cause" in md


def test_an_unknown_link_is_missing_not_guessed():
    """The real DDP traces with their device renamed to one proflab has no link figure for."""
    from dataclasses import replace

    from proflab.render import render

    summaries, _, _ = jobs.rank_summaries(DDP, {})
    renamed = [replace(s, stats={**s.stats, "device_name": "NVIDIA Example X1"}) for s in summaries]
    rep = jobs._job_report(renamed, "in process", world_size=2)
    assert rep.link is None
    assert any(m.signal == "link peak bandwidth" and "NVIDIA Example X1" in m.reason for m in rep.missing)
    sized = [c for c in rep.collectives if c["busbw_gbps"] is not None]
    assert sized and all(c["busbw_of_link_pct"] is None for c in sized)
    assert "% link" not in render(rep, "term", width=80)
    # a CPU job has no message sizes: no bandwidth, so no link is missing for it either
    gloo = jobs.analyze_job(STRAGGLER)
    assert not any(m.signal == "link peak bandwidth" for m in gloo.missing)
