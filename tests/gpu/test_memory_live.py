"""Memory workloads recorded live on this GPU (tests/data/record/record_memory.py): the
report's peak must match the allocator's own max_memory_allocated of the same steps, and the
planted finding must come first. The committed traces (tests/data/memory) prove this on one
recording; these prove it with whatever torch and driver the GPU machine has today."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import proflab

pytestmark = pytest.mark.gpu

RECORDER = Path(__file__).resolve().parents[1] / "data" / "record" / "record_memory.py"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("memory")
    subprocess.run([sys.executable, str(RECORDER), "--out", str(out), "--only", "graph_leak", "fragmenting", "healthy"],
                   check=True, timeout=600)
    return out, json.loads((out / "ground_truth.json").read_text())


@pytest.mark.parametrize("name, top, warns", [("graph_leak", "memory_leak", True), ("fragmenting", "memory_fragmentation", True),
                                              ("healthy", "memory_headroom", False)])
def test_live_peak_and_finding(recorded, name, top, warns):
    out, gt = recorded
    rep = proflab.analyze(out / f"{name}.pt.trace.json.gz")
    d = rep.memory["devices"][0]
    assert d["peak_allocated_mib"] == pytest.approx(gt[name]["max_memory_allocated_mib"], rel=0.02)
    assert d["peak_reserved_mib"] == pytest.approx(gt[name]["max_memory_reserved_mib"], rel=0.02)
    fs = [f for f in rep.findings if f.category.startswith("memory_")]
    assert fs[0].category == top
    assert (fs[0].severity != "info") == warns
