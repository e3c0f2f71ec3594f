"""Job verdicts on real 2x H200 NCCL jobs, checked against their bare (unprofiled) step times.

The jobs (tests/data/kineto/nccl, recorded by tests/data/record/record_nccl.py) are one
scenario each at 1 and 2 GPUs, with each rank's bare GPU-side step times measured in the same
process before and after its profiled window (``truth.json`` beside the traces). Ranks run in
lockstep, so a job's bare step is its slowest rank's median. What the bare runs say:

- ``straggler``: rank 1 sleeps 30 ms per step; both ranks step at ~34.8 ms.
- ``commbound``: 1 -> 2 GPUs takes the step from 7.52 to 10.60 ms (weak scaling ~71%).
- ``commbound_fixed``: the bf16 hook and larger buckets: 10.17 ms at 2 GPUs, but 8.99 ms at 1
  GPU (the hook's casts cost compute).
- ``balanced``: 2.96 -> 3.21 ms (~92%): the all-reduces are hidden under backward.
- ``fsdp``: 14.7 -> 18.8 ms (~78%); under the profiler its host paces the job (~26 ms steps).

A finding's estimated gain is what it claims for the profiled window; the bare runs give what
scaling actually lost there (the 2-GPU bare step minus the 1-GPU one, per profiled step). A
verdict that survives the profiler brackets it: the claimed gain is no more than the loss, and
the most the collectives can cost the window is no less.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from proflab.report import job as jobs
from proflab.cli import main
from proflab.readers import expand_paths

NCCL = Path(__file__).parent / "data" / "kineto" / "nccl"
PARAM_BYTES = 6 * (8192 * 8192 + 8192) * 4  # six Linear(8192, 8192) layers, fp32


def truth(scenario: str, gpus: int) -> dict:
    return json.loads((NCCL / scenario / f"{gpus}gpu" / "truth.json").read_text())


def bare_step(scenario: str, gpus: int) -> float:
    """The job's unprofiled step (ms): its slowest rank's median."""
    return max(statistics.median(r["bare"]["gpu_step_ms"]) for r in truth(scenario, gpus)["ranks"])


def bare_loss_per_step(scenario: str) -> float:
    """What going from 1 to 2 GPUs costs a step, unprofiled (ms): the findings' gains are per step."""
    return bare_step(scenario, 2) - bare_step(scenario, 1)


def per_step(window_ms: float, scenario: str) -> float:
    """A window figure of the evidence (``upper_bound_ms``) per step of the profiled window."""
    return window_ms / truth(scenario, 2)["schedule"]["active"]


@pytest.fixture(scope="module")
def job():
    made: dict = {}

    def get(scenario: str):
        if scenario not in made:
            made[scenario] = jobs.analyze_job([NCCL / scenario / "2gpu"])  # a folder, as documented
        return made[scenario]

    return get


def findings(rep) -> dict:
    return {f.category: f for f in rep.findings}


def test_a_folder_with_its_ground_truth_reads_only_the_traces():
    paths = expand_paths([NCCL / "commbound" / "2gpu"])
    assert [p.name for p in paths] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    # named on its own, the ground truth is refused as what it is
    assert main(["analyze", str(NCCL / "commbound" / "2gpu" / "truth.json")]) == 2


def test_the_recordings_are_what_the_scenarios_say():
    for scenario in ("balanced", "straggler", "commbound", "commbound_fixed", "fsdp"):
        t = truth(scenario, 2)
        assert t["world_size"] == 2 and len(t["ranks"]) == 2 and "H200" in t["device"]
        # ranks run in lockstep: unprofiled, every rank steps at the same pace
        meds = [statistics.median(r["bare"]["gpu_step_ms"]) for r in t["ranks"]]
        assert max(meds) / min(meds) < 1.02, (scenario, meds)
    assert bare_step("straggler", 2) > truth("straggler", 2)["straggler_ms"]
    assert bare_step("commbound", 2) / bare_step("commbound", 1) > 1.3  # communication-bound
    assert bare_step("balanced", 2) / bare_step("balanced", 1) < 1.12  # hidden under backward


def test_the_straggler_is_named_with_its_cause(job):
    rep = job("straggler")
    f = findings(rep)
    li = f["load_imbalance"]
    planted = truth("straggler", 2)["straggler_ms"]
    assert li.id == "load_imbalance" and li.severity == "critical"
    assert li.evidence["slow_rank"] == 1 and li.evidence["cause"] == "host"
    # the lead is the planted sleep, and never more than the whole unprofiled step
    assert planted <= li.evidence["late_per_step_ms"] <= bare_step("straggler", 2)
    assert planted <= li.evidence["slow_host_ms_per_step"] <= 1.2 * planted
    # rank 0's NCCL time is waiting for rank 1, not communication
    assert "communication_bound" not in f or f["communication_bound"].severity == "info"
    r0 = next(r for r in rep.ranks if r["rank"] == 0)
    assert r0["wait_ms"] > 10 * r0["transfer_ms"]


def test_communication_bound_is_found_and_its_gain_bracketed_by_the_bare_loss(job):
    cb = findings(job("commbound"))["communication_bound"]
    assert cb.severity == "critical"
    ev = cb.evidence
    assert ev["bytes_per_step"] == PARAM_BYTES  # every fp32 gradient, once per step
    assert ev["collectives"] == ["allreduce"] and ev["dtypes"] == ["Float"]
    assert ev["exposed_while_host_starved_ms"] == 0  # the hosts keep ahead: nothing to discount
    assert 150 < ev["busbw_gbps"] < ev["link_gbps_per_direction"]
    loss = bare_loss_per_step("commbound")
    assert cb.est_gain_ms <= loss <= per_step(ev["upper_bound_ms"], "commbound"), (cb.est_gain_ms, loss, ev["upper_bound_ms"])
    assert cb.est_gain_ms >= 0.6 * loss
    # the ranks replayed together do not give back this job's step (a collective waits for a
    # GEMM to free the SMs): the gain is the exposed transfer it measured, and says so
    assert cb.prediction["model"] == "idle time"
    assert "bf16_compress_hook" in cb.fix and "gradient_as_bucket_view" in cb.fix


def test_the_proposed_fix_halves_the_bytes_and_its_real_gain_is_within_the_claim(job):
    before = findings(job("commbound"))["communication_bound"]
    after = findings(job("commbound_fixed"))["communication_bound"]
    assert after.evidence["dtypes"] == ["BFloat16"]
    assert after.evidence["bytes_per_step"] * 2 == PARAM_BYTES
    assert after.evidence["exposed_transfer_ms"] <= 0.6 * before.evidence["exposed_transfer_ms"]
    assert after.est_gain_ms < before.est_gain_ms
    # unprofiled, the fix saves time at 2 GPUs, less than the exposed transfer it removed:
    # the hook's casts cost compute (its 1-GPU step is slower)
    saved = bare_step("commbound", 2) - bare_step("commbound_fixed", 2)
    assert 0 < saved <= before.est_gain_ms
    assert bare_step("commbound_fixed", 1) > bare_step("commbound", 1)
    loss = bare_loss_per_step("commbound_fixed")
    assert after.est_gain_ms <= loss <= per_step(after.evidence["upper_bound_ms"], "commbound_fixed")


def test_a_balanced_job_gets_no_warning(job):
    rep = job("balanced")
    assert not [f for f in rep.findings if f.severity in ("warning", "critical")], [f.title for f in rep.findings]
    cb = findings(rep).get("communication_bound")
    if cb is not None:
        assert cb.est_gain_ms <= bare_loss_per_step("balanced") <= per_step(cb.evidence["upper_bound_ms"], "balanced")


def test_fsdp_paced_by_its_host_under_the_profiler_claims_only_what_it_can_confirm(job):
    rep = job("fsdp")
    f = findings(rep)
    kinds = {c["collective"] for c in rep.to_dict()["collectives"]}
    assert kinds == {"allgather", "reducescatter"}
    # unprofiled both ranks step together: no straggler is claimed
    li = f.get("load_imbalance")
    assert li is None or (li.id == "load_imbalance_unconfirmed" and li.est_gain_ms == 0)
    cb = f["communication_bound"]
    ev = cb.evidence
    assert ev["exposed_while_host_starved_ms"] > ev["exposed_blocking_ms"]
    loss = bare_loss_per_step("fsdp")
    assert cb.est_gain_ms <= loss <= per_step(ev["upper_bound_ms"], "fsdp"), (cb.est_gain_ms, loss, ev["upper_bound_ms"])
    assert "host was behind" in cb.fix and "proflab scaling" in cb.fix
    assert "forward_prefetch" in cb.fix


@pytest.mark.parametrize("scenario", ["commbound", "commbound_fixed", "balanced", "fsdp"])
def test_weak_scaling_efficiency_matches_the_bare_runs(scenario, capsys):
    assert main(["scaling", "--mode", "weak", str(NCCL / scenario / "1gpu"), str(NCCL / scenario / "2gpu"), "-f", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["points"]
    two = next(r for r in rows if r["gpus"] == 2)
    bare_eff = 100 * bare_step(scenario, 1) / bare_step(scenario, 2)
    # from the profiled steps; the profiler's inflation mostly cancels between the two runs
    assert abs(two["efficiency_pct"] - bare_eff) <= 5.0, (two["efficiency_pct"], bare_eff)
    if scenario == "commbound":
        # the loss is exposed communication, within 20% of what the bare runs lost per step
        loss = bare_step(scenario, 2) - bare_step(scenario, 1)
        assert abs(two["exposed_comm_ms_per_step"] - loss) <= 0.2 * loss


def test_scaling_states_the_bare_efficiency_where_the_points_have_it(job):
    """`proflab run` measures each rank's unprofiled step; given those, the scaling table adds
    the efficiency the program really has beside the profiled one (here the bare steps come
    from the recordings' ground truth)."""
    from dataclasses import replace

    from proflab.report.scaling import point_of, scaling_rows
    from proflab.api import analyze
    from proflab.render.scaling import render_scaling
    from proflab.report import ScalingReport

    one = point_of("1gpu", analyze(NCCL / "balanced" / "1gpu" / "rank0.pt.trace.json.gz"))
    two = point_of("2gpu", job("balanced"))
    assert one.bare_step_ms is None and two.bare_step_ms is None  # plain traces: not measured
    rows = scaling_rows([one, two], "weak")
    assert rows[1]["bare_efficiency_pct"] is None and "bare eff" not in render_scaling(ScalingReport("weak", tuple(rows), ()), "term")
    one, two = replace(one, bare_step_ms=bare_step("balanced", 1)), replace(two, bare_step_ms=bare_step("balanced", 2))
    rows = scaling_rows([one, two], "weak")
    want = round(100 * bare_step("balanced", 1) / bare_step("balanced", 2), 1)
    assert rows[1]["bare_efficiency_pct"] == want
    assert rows[1]["efficiency_pct"] != want  # the profiled steps say otherwise: both are shown
    assert "bare eff %" in render_scaling(ScalingReport("weak", tuple(rows), ()), "term")
