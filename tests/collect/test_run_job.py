"""``proflab run -- torchrun ...`` of a real 2-process DDP job on CPU (gloo): the run's own
summary, analysis.json and ``proflab analyze RUN_DIR`` are one job report.

Two runs of the same loop: balanced, and with a planted straggler (rank 1 sleeps 80 ms on
the host before each step: well above the compute skew two ranks sharing a loaded 2-core
machine show). Needs torch (skipped where it is not installed, as in CI).

On a shared 2-core machine the two ranks also compete for the cores, so the balanced run's
ranks can truly differ in compute from step to step; what it must never show is the planted
cause (host work on rank 1).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proflab.cli import main

PROFLAB = [sys.executable, "-m", "proflab"]
SLEEP_MS = 80.0

DDP = """
import sys, time
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
sleep_ms = float(sys.argv[1])
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, 512)
for _ in range(16):
    if rank == 1 and sleep_ms:
        time.sleep(sleep_ms / 1e3)  # planted host work on rank 1
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
dist.destroy_process_group()
"""


def _launcher() -> list[str]:
    """torchrun's console script where it is installed next to this interpreter, else the module."""
    script = Path(sys.executable).parent / "torchrun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]


def _run(tmp: Path, sleep_ms: float, launcher: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
    (tmp / "prog.py").write_text(DDP)
    done = subprocess.run(
        [*PROFLAB, "run", "-o", str(tmp / "runs"), "--", *launcher, "--standalone", "--nproc_per_node", "2",
         "prog.py", str(sleep_ms)], capture_output=True, text=True, timeout=600, cwd=tmp,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = [p for p in (tmp / "runs").iterdir() if p.is_dir()]
    return done, run


@pytest.fixture(scope="module")
def straggler(tmp_path_factory):
    """The straggler's run; once more where its profiled window was disturbed (a loaded
    machine can stretch the window's steps past the bare step, and the report then says the
    lead is unconfirmed rather than name a straggler: honest, but not this test's subject)."""
    pytest.importorskip("torch")
    for _ in range(2):
        done, run = _run(tmp_path_factory.mktemp("straggler"), SLEEP_MS, [sys.executable, "-m", "torch.distributed.run"])
        li = _finding(json.loads((run / "analysis.json").read_text()), "load_imbalance")
        if li is None or li["id"] != "load_imbalance_unconfirmed" or "disturbed" not in li["title"]:
            break
    return done, run


@pytest.fixture(scope="module")
def balanced(tmp_path_factory):
    pytest.importorskip("torch")
    return _run(tmp_path_factory.mktemp("balanced"), 0.0, _launcher())


def _finding(doc: dict, category: str) -> dict | None:
    return next((f for f in doc["findings"] if f["category"] == category), None)


def test_the_run_summary_is_the_job_report_naming_the_straggler(straggler):
    done, run = straggler
    out = done.stdout
    assert "proflab job · 2 ranks of 2 · gloo" in out, out[-3000:]
    assert out.index("proflab job") < out.index("── rank 0 ──") < out.index("── rank 1 ──")
    assert (run / "summary.txt").read_text().endswith(out[out.index("proflab job") :])
    doc = json.loads((run / "analysis.json").read_text())
    assert doc["schema"] == "proflab.job/1" and doc["source"]["ranks"] == [0, 1]
    jsonschema = pytest.importorskip("jsonschema")
    import proflab

    jsonschema.validate(doc, json.loads((Path(proflab.__file__).parent / "schema" / "job.schema.json").read_text()))
    li = _finding(doc, "load_imbalance")
    assert li is not None and li["id"] == "load_imbalance", doc["findings"]
    assert li["evidence"]["slow_rank"] == 1 and li["evidence"]["cause"] == "host"
    ev = li["evidence"]
    # the planted sleep, as the trace shows it (a loaded machine wakes a sleeper late)
    assert 0.8 * SLEEP_MS <= ev["slow_host_ms_per_step"] <= 2.5 * SLEEP_MS
    assert ev["others_host_ms_per_step"] < 0.5 * SLEEP_MS
    # the lead is the sleep plus whatever compute rank 1 did beyond rank 0's (the ranks
    # share two cores with everything else here): no more, give or take one sleep
    assert 0.6 * SLEEP_MS <= ev["late_per_step_ms"]
    assert ev["late_per_step_ms"] <= ev["slow_host_ms_per_step"] + max(ev["slow_compute_excess_ms_per_step"], 0) + SLEEP_MS
    assert li["severity"] in ("warning", "critical")
    meta = json.loads((run / "meta.json").read_text())
    assert meta["analysis"]["job"] is True and meta["analysis"]["top_finding"].startswith("load_imbalance")


def test_each_rank_row_carries_its_process_step_times(straggler):
    done, run = straggler
    doc = json.loads((run / "analysis.json").read_text())
    timed = {}
    for p in (run / "processes").glob("*.json"):
        info = json.loads(p.read_text())
        if info.get("rank") is not None and info.get("traces"):
            timed[int(info["rank"])] = info["step_times"]
    assert sorted(timed) == [0, 1]
    for row in doc["ranks"]:
        st = timed[row["rank"]]
        assert row["bare_step_ms"] == pytest.approx(st["bare_ms"], abs=1e-3)
        assert row["profiled_step_ms"] == pytest.approx(st["profiled_ms"], abs=1e-3)
        assert row["step_side"] == "host"  # a CPU job: no GPU-side step exists
        # rank 1's sleep is in every rank's step: DDP holds them in lockstep
        assert row["bare_step_ms"] > SLEEP_MS
    head = next(line for line in done.stdout.splitlines() if line.strip().startswith("rank  step ms"))
    assert "bare" in head.split()


def test_analyze_run_dir_gives_the_same_job_report(straggler, capsys):
    _, run = straggler
    assert main(["analyze", str(run), "-f", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "proflab.job/1"
    li = _finding(doc, "load_imbalance")
    assert li["evidence"]["slow_rank"] == 1 and li["evidence"]["cause"] == "host"
    assert [r["bare_step_ms"] for r in doc["ranks"]] == [
        r["bare_step_ms"] for r in json.loads((run / "analysis.json").read_text())["ranks"]
    ]


def test_balanced_run_shows_no_planted_cause(balanced):
    done, run = balanced
    assert "proflab job · 2 ranks of 2 · gloo" in done.stdout
    doc = json.loads((run / "analysis.json").read_text())
    li = _finding(doc, "load_imbalance")
    # two ranks sharing a loaded machine may truly arrive apart (their trace says so), but
    # no rank does the planted host work
    assert li is None or li["evidence"]["slow_host_ms_per_step"] < 0.5 * SLEEP_MS, li
    for f in doc["findings"]:
        if f["id"] == "load_imbalance_unconfirmed":  # a lead longer than the bare step: no gain
            assert f["est_gain_ms"] == 0 and f["evidence"]["late_per_step_ms"] >= min(r["bare_step_ms"] for r in doc["ranks"])
