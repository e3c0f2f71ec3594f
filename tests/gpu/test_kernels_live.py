"""`proflab kernels` end to end on the GPU machine: a real training step, real ncu."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from proflab.cli import main

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "data" / "record" / "train_step.py"
WORKLOADS = ROOT / "tests" / "data" / "record" / "ncu_workloads.py"
needs_ncu = pytest.mark.skipif(shutil.which("ncu") is None, reason="ncu is not on the PATH")


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trace")
    subprocess.run([sys.executable, str(PROGRAM), "--steps", "6", "--trace", str(out)], check=True)
    (path,) = sorted(out.glob("*.pt.trace.json.gz"))
    return path


@needs_ncu
def test_kernels_end_to_end(trace, tmp_path, capsys):
    ncu_dir = tmp_path / "ncu"
    rc = main(["kernels", str(trace), "--ncu-dir", str(ncu_dir), "-f", "json", "-o", str(tmp_path / "k.json"),
               "--", sys.executable, str(PROGRAM), "--steps", "4"])
    assert rc == 0
    d = json.loads((tmp_path / "k.json").read_text())
    assert d["kernel_verdicts"], "no verdicts"
    for v in d["kernel_verdicts"]:
        assert v["bound"] in ("memory", "compute", "latency")
        assert v["metrics"]["duration_ns"] > 0
        assert v["roofline"] is not None and v["roofline"]["duration_us"] > 0
    # joined to the timeline: hot-kernel rows carry verdicts, kernel findings have a gain over the window
    assert any("ncu" in k for k in d["kernels"])
    kernel_cats = {"memory_bound", "compute_bound", "latency_bound", "low_occupancy", "warp_stalls",
                   "uncoalesced_access", "bank_conflicts", "divergence"}
    kf = [f for f in d["findings"] if f["category"] in kernel_cats]
    assert kf and all(f["evidence"]["kernel_time_from"] == "timeline" for f in kf)
    for name in ("raw.csv", "details.csv", "report.ncu-rep", "kernels.json", "roofline.svg", "ncu.log"):
        assert (ncu_dir / name).exists(), name
    err = capsys.readouterr().err
    assert "profiling" in err and "--launch-skip" not in err


@needs_ncu
def test_kernel_filter_that_matches_nothing_names_the_kernels(trace, capsys):
    rc = main(["kernels", str(trace), "-k", "no_such_kernel_xyz", "--", sys.executable, str(PROGRAM)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "matches no kernel" in err and "hottest kernels are" in err


@needs_ncu
def test_ncu_rep_read_through_ncu_import(tmp_path):
    from proflab.readers import ncu

    base = tmp_path / "w"
    subprocess.run(["ncu", "--clock-control", "none", "--profile-from-start", "off", "--section", "SpeedOfLight",
                    "--section", "Occupancy", "-f", "-o", str(base), sys.executable, str(WORKLOADS),
                    "--only", "pf_stream_triad", "pf_tiny"], check=True)
    prof = ncu.read(base.with_suffix(".ncu-rep"))
    assert prof.kind == "ncu-rep" and prof.launches["name"].to_list() == ["pf_stream_triad", "pf_tiny"]
    assert prof.value(0, "gpu__time_duration.sum") > prof.value(1, "gpu__time_duration.sum") > 0
    assert prof.rules.height > 0
