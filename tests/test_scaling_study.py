"""The scaling study on 1, 2 and 4 H200s, checked against the loops' bare (unprofiled) steps.

tests/data/kineto/scaling holds, per scenario (``balanced``, ``commbound``, ``straggler``: the
loops of tests/data/record/record_nccl.py), what tests/data/record/record_scaling.py recorded
on one 4x H200 host (NVLink, NV18) in one session:

- ``bare/<N>gpu/rank<r>.json``: the loop under plain torchrun, no profiler anywhere, each
  step timed between CUDA events (the ground truth);
- ``runs/*/*-<N>gpu/``: the run directories ``proflab scaling --gpus 1,2,4 -- torchrun ...``
  wrote (light profiler: no shapes, no stacks), with each rank's unprofiled step that
  ``proflab run`` timed GPU-side outside its window;
- ``profiled/<N>gpu/rank<r>.json``: the program's own CUDA-event step times in those runs.

A job's step is its slowest rank's median (ranks run in lockstep). No 8-GPU host was lent.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proflab.report import job as jobs
from proflab.cli import main

STUDY = Path(__file__).parent / "data" / "kineto" / "scaling"
COUNTS = (1, 2, 4)
PARAM_BYTES = 6 * (8192 * 8192 + 8192) * 4  # commbound: six Linear(8192, 8192) layers, fp32
STRAGGLER_MS = 30.0  # record_nccl.py: rank 1 sleeps this long before each forward
ACTIVE = 5  # proflab run's default window: five recorded steps


def _times(scenario: str, kind: str, gpus: int) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((STUDY / scenario / kind / f"{gpus}gpu").glob("rank*.json"))]


def bare_step(scenario: str, gpus: int) -> float:
    """The job's unprofiled step (ms), from the plain torchrun run: its slowest rank's median."""
    return max(r["median_ms"] for r in _times(scenario, "bare", gpus))


def run_dir(scenario: str, gpus: int) -> Path:
    (run,) = (STUDY / scenario / "runs").glob(f"*/*-{gpus}gpu")
    return run


def step_times(run: Path) -> dict[int, dict]:
    """Each rank's step times as ``proflab run`` recorded them (processes/<pid>.json)."""
    out = {}
    for p in (run / "processes").glob("*.json"):
        info = json.loads(p.read_text())
        if (info.get("step_times") or {}).get("bare_n"):
            out[int(info["rank"])] = info["step_times"]
    return out


@pytest.fixture(scope="module")
def job():
    made: dict = {}

    def get(scenario: str, gpus: int):
        if (scenario, gpus) not in made:
            made[scenario, gpus] = jobs.analyze_job([run_dir(scenario, gpus)])
        return made[scenario, gpus]

    return get


def findings(rep) -> dict:
    return {f.category: f for f in rep.findings}


def test_the_recordings_are_what_the_scenarios_say():
    for scenario in ("balanced", "commbound", "straggler"):
        for n in COUNTS:
            bare = _times(scenario, "bare", n)
            assert [r["rank"] for r in bare] == list(range(n)) and all("H200" in r["device"] for r in bare)
            meds = [r["median_ms"] for r in bare]
            assert max(meds) / min(meds) < 1.02, (scenario, n, meds)  # lockstep
            assert len(list((run_dir(scenario, n) / "traces").glob("rank*.pt.trace.json.gz"))) == n
    assert bare_step("commbound", 4) / bare_step("commbound", 1) > 1.5  # 1.6 GB of fp32 gradients a step
    assert bare_step("balanced", 4) / bare_step("balanced", 1) < 1.5
    for n in (2, 4):
        assert bare_step("straggler", n) > STRAGGLER_MS + bare_step("balanced", 1)


@pytest.mark.parametrize("scenario", ["balanced", "commbound", "straggler"])
def test_proflab_run_timed_every_ranks_unprofiled_step_on_the_gpu(scenario):
    """The unprofiled step `proflab run` measured in each rank's process is the GPU's: within
    0.5% of the program's own CUDA-event times in the same process, and within 2.5% of the
    plain run's (another process, minutes apart). On the host's clock it was 12-30% short on
    the host-bound loops (the host runs ahead of its GPU), which `host_bare_ms` keeps."""
    for n in COUNTS:
        timed = step_times(run_dir(scenario, n))
        own = {r["rank"]: r["median_ms"] for r in _times(scenario, "profiled", n)}
        assert sorted(timed) == list(range(n))
        for rank, st in timed.items():
            assert st["clock"] == "gpu", st
            assert st["bare_ms"] == pytest.approx(own[rank], rel=0.005), (scenario, n, rank)
            assert st["bare_ms"] == pytest.approx(bare_step(scenario, n), rel=0.025), (scenario, n, rank)
    host = step_times(run_dir("balanced", 4))
    assert min(st["host_bare_ms"] for st in host.values()) < 0.9 * bare_step("balanced", 4)


@pytest.mark.parametrize("scenario", ["balanced", "commbound", "straggler"])
def test_weak_scaling_efficiency_from_the_unprofiled_steps_is_the_programs(scenario, capsys):
    runs = [str(run_dir(scenario, n)) for n in COUNTS]
    assert main(["scaling", "--mode", "weak", *runs, "-f", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    rows = {r["gpus"]: r for r in rep["points"]}
    assert sorted(rows) == list(COUNTS)
    for n in (2, 4):
        truth = 100 * bare_step(scenario, 1) / bare_step(scenario, n)
        assert rows[n]["bare_efficiency_pct"] == pytest.approx(truth, abs=1.5), (n, rows[n], truth)
        disagree = abs(rows[n]["efficiency_pct"] - rows[n]["bare_efficiency_pct"]) >= 2
        # a note says which efficiency is the program's wherever the profiled one is off
        assert disagree == any(n_.startswith(f"at {n} GPUs the profiled steps give") for n_ in rep["notes"])
    if scenario == "commbound":
        for n in (2, 4):
            # GPU-bound: the profiler leaves the step alone, both efficiencies are the program's
            truth = 100 * bare_step(scenario, 1) / bare_step(scenario, n)
            assert rows[n]["efficiency_pct"] == pytest.approx(truth, abs=1.5)
            # and the loss is exposed communication: within 10% of what the bare runs lost per step
            loss = bare_step(scenario, n) - bare_step(scenario, 1)
            assert rows[n]["exposed_comm_ms_per_step"] == pytest.approx(loss, rel=0.10), (n, rows[n], loss)
    else:
        # host-bound base: the profiler slows the 1-GPU run more (1.4-1.6x) than the others,
        # and the profiled efficiency overstates scaling; the note names the unprofiled one
        assert rows[4]["efficiency_pct"] > rows[4]["bare_efficiency_pct"] + 2
        assert any(f"{rows[4]['bare_efficiency_pct']:g}% is the program's efficiency" in x for x in rep["notes"])
    if scenario == "straggler":
        for n in (2, 4):  # the loss is the straggler: waiting for rank 1's planted sleep
            wait = rows[n]["imbalance_wait_ms_per_step"]
            assert STRAGGLER_MS <= wait <= 1.1 * STRAGGLER_MS and wait >= 0.9 * rows[n]["loss_ms_per_step"], rows[n]


@pytest.mark.parametrize("gpus", [2, 4])
def test_a_balanced_job_gets_no_warning(job, gpus):
    rep = job("balanced", gpus)
    assert not [f for f in rep.findings if f.severity in ("warning", "critical")], [f.title for f in rep.findings]
    assert all(r["bare_step_ms"] == pytest.approx(bare_step("balanced", gpus), rel=0.025) for r in rep.ranks)
    assert {r["bare_clock"] for r in rep.ranks} == {"gpu"}


@pytest.mark.parametrize("gpus", [2, 4])
def test_communication_bound_is_found_and_its_gain_within_the_bare_loss(job, gpus):
    cb = findings(job("commbound", gpus))["communication_bound"]
    # exposed transfer: 30% of the window at 2 GPUs, 38% at 4
    assert cb.severity == ("warning" if gpus == 2 else "critical")
    ev = cb.evidence
    assert ev["bytes_per_step"] == PARAM_BYTES and ev["collectives"] == ["allreduce"]
    assert ev["exposed_while_host_starved_ms"] == 0
    assert 150 < ev["busbw_gbps"] < ev["link_gbps_per_direction"]
    # what going from 1 GPU to this count costs a step unprofiled (the finding's gain is per step)
    loss = bare_step("commbound", gpus) - bare_step("commbound", 1)
    assert 0.6 * loss <= cb.est_gain_ms <= loss, (cb.est_gain_ms, loss)
    assert ev["upper_bound_ms"] >= 0.95 * loss * ACTIVE, (ev["upper_bound_ms"], loss)


@pytest.mark.parametrize("gpus", [2, 4])
def test_the_straggler_is_named_at_every_count(job, gpus):
    rep = job("straggler", gpus)
    li = findings(rep)["load_imbalance"]
    assert li.id == "load_imbalance" and li.severity == "critical"
    assert li.evidence["slow_rank"] == 1 and li.evidence["cause"] == "host"
    # the lead is the planted sleep, and never more than the whole unprofiled step
    assert STRAGGLER_MS <= li.evidence["late_per_step_ms"] <= bare_step("straggler", gpus)
    others = set(range(gpus)) - {1}
    assert {int(r) for r in li.evidence["others_wait_ms"]} == others


def test_the_ranks_analysed_on_dask_workers_give_the_in_process_report(job):
    local = job("commbound", 4)
    on_dask = jobs.analyze_job([run_dir("commbound", 4)], workers=2)
    assert on_dask.summary["engine"] != local.summary["engine"]
    a, b = local.to_dict(), on_dask.to_dict()
    for d in (a, b):
        d["summary"].pop("engine")
    assert a == b


# -- strong scaling: the same global batch over 1, 2 and 4 GPUs ---------------------------------
# tests/data/kineto/scaling/strong/<scenario> holds what ``record_scaling.py --mode strong``
# recorded at 1 and 2 GPUs (balanced: global batch 1024, commbound: 256) on the same kind of host,
# in a later session; at 4 GPUs each rank's share is the weak study's batch per GPU (256 and
# 64), so its 4-GPU run is the strong study's 4-GPU point. The commbound 2-GPU run under
# proflab was cut off by the recording's time limit: its bare runs are here, its run directory
# is not (``scaling.first-attempt.json`` is the report an earlier attempt wrote on the host).
STRONG = STUDY / "strong"
GLOBAL_BATCH = {"balanced": 1024, "commbound": 256}


def strong_bare(scenario: str, gpus: int) -> float:
    if gpus == 4:
        return bare_step(scenario, 4)
    return max(json.loads(p.read_text())["median_ms"] for p in (STRONG / scenario / "bare" / f"{gpus}gpu").glob("rank*.json"))


def strong_runs(scenario: str) -> dict[int, Path]:
    runs = {int(p.name.rsplit("-", 1)[1].removesuffix("gpu")): p for p in (STRONG / scenario / "runs").glob("*/*gpu")}
    return {**runs, 4: run_dir(scenario, 4)}


def _strong_report(scenario: str, capsys) -> dict[int, dict]:
    runs = strong_runs(scenario)
    assert main(["scaling", "--mode", "strong", *(str(runs[n]) for n in sorted(runs)), "-f", "json"]) == 0
    return {r["gpus"]: r for r in json.loads(capsys.readouterr().out)["points"]}


@pytest.mark.parametrize("scenario", ["balanced", "commbound"])
def test_the_strong_recordings_share_one_global_batch(scenario):
    """Every point of a strong study runs the same global batch: the 4-GPU weak run included."""
    for n in (1, 2, 4):
        folder = (STRONG / scenario / "bare" / f"{n}gpu") if n < 4 else (STUDY / scenario / "bare" / "4gpu")
        for p in folder.glob("rank*.json"):
            r = json.loads(p.read_text())
            per_gpu = int(r["description"].split("batch ")[1].split("/GPU")[0])
            assert per_gpu * n == GLOBAL_BATCH[scenario] and "H200" in r["device"], (scenario, n, r["description"])


def test_strong_scaling_of_the_host_bound_loop_from_its_unprofiled_steps(capsys):
    rows = _strong_report("balanced", capsys)
    assert sorted(rows) == [1, 2, 4]
    for n in (2, 4):
        truth = 100 * strong_bare("balanced", 1) / (n * strong_bare("balanced", n))
        # the 1-GPU base is host-bound: proflab's unprofiled step (3.31 ms) and the plain run's
        # (2.94 ms, another process on a loaded host) differ by 12%, the efficiencies by < 3 points
        assert rows[n]["bare_efficiency_pct"] == pytest.approx(truth, abs=3), (n, rows[n], truth)
    # halving the batch does not halve a host-bound step: efficiency falls fast, and the loss is
    # neither communication nor waiting at 4 GPUs
    assert rows[4]["bare_efficiency_pct"] < rows[2]["bare_efficiency_pct"] < 50
    assert rows[4]["other_ms_per_step"] > rows[4]["exposed_comm_ms_per_step"] + rows[4]["imbalance_wait_ms_per_step"]


def test_strong_scaling_of_the_communication_bound_loop_splits_its_loss(capsys):
    rows = _strong_report("commbound", capsys)
    assert sorted(rows) == [1, 4]
    truth = 100 * strong_bare("commbound", 1) / (4 * strong_bare("commbound", 4))
    assert rows[4]["bare_efficiency_pct"] == pytest.approx(truth, abs=1), rows[4]
    assert rows[4]["efficiency_pct"] == pytest.approx(truth, abs=1.5)  # GPU-bound: the profiler leaves it alone
    # the loss is exposed communication (what the weak study lost at 4 GPUs: the same transfer)
    # plus compute that does not shrink with the batch (a quarter batch takes 7.49 ms, not 15.42 / 4)
    weak_loss = bare_step("commbound", 4) - bare_step("commbound", 1)
    assert rows[4]["exposed_comm_ms_per_step"] == pytest.approx(weak_loss, rel=0.10), rows[4]
    unshrunk = bare_step("commbound", 1) - strong_bare("commbound", 1) / 4
    assert rows[4]["other_ms_per_step"] == pytest.approx(unshrunk, rel=0.10), (rows[4], unshrunk)
    # the 2-GPU point, from the plain runs and the earlier attempt's report on the host
    first = {r["gpus"]: r for r in json.loads((STRONG / "commbound" / "scaling.first-attempt.json").read_text())["points"]}
    two = 100 * strong_bare("commbound", 1) / (2 * strong_bare("commbound", 2))
    assert first[2]["bare_efficiency_pct"] == pytest.approx(two, abs=1)
