"""Traces of any size: bounded memory on a realistic-shape trace (issue 20).

The trace comes from ``benchmarks/gen_realistic.py`` (one hot host thread, forward/backward
ranges over thousands of GPU gaps, NCCL on a second stream), built from the recorded
``train_loop`` trace. No timing asserts: the memory bound is what holds on any machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from conftest import KINETO_DIR

ROOT = Path(__file__).resolve().parent.parent
GEN = ROOT / "benchmarks" / "gen_realistic.py"
SOURCE = KINETO_DIR / "train_loop.pt.trace.json.gz"

# The bound: peak RSS <= 0.4 x the uncompressed Kineto size + 300 MB.
MB = 10**6


def _bound_bytes(size: int) -> float:
    return 0.4 * size + 300 * MB


@pytest.fixture(scope="module")
def realistic(tmp_path_factory) -> Path:
    if not SOURCE.exists():
        pytest.skip(f"missing recorded trace {SOURCE.name}")
    out = tmp_path_factory.mktemp("scale") / "realistic.json"
    subprocess.run([sys.executable, str(GEN), str(out), "--size-mb", "30"], check=True, capture_output=True, timeout=300)
    return out


def _env() -> dict[str, str]:
    # the child imports the proflab under test, as this process does
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def test_generated_trace_has_the_realistic_shape(realistic):
    """What makes the trace hard is there: a hot thread, long ranges, NCCL, many gaps."""
    from proflab import load
    from proflab.analysis import Context

    assert 28 * MB < realistic.stat().st_size < 60 * MB
    t = load(realistic)
    host = t.cpu.group_by("tid").len().sort("len", descending=True)
    assert host["len"][0] > 0.9 * t.cpu.height  # one hot host thread
    assert t.cpu.filter(pl.col("cat") == "cpu_op").height > 20_000
    assert t.steps.height >= 2
    assert t.gpu.filter(pl.col("is_comm"))["stream"].unique().to_list() == [20]
    assert t.gpu.filter(~pl.col("is_comm"))["stream"].unique().to_list() == [7]
    assert t.cpu.filter(pl.col("cat") == "gpu_user_annotation").height == t.steps.height
    gaps = Context(t).gaps
    assert gaps.height > 3_000
    ranges = t.cpu.filter(pl.col("name").is_in(["## forward ##", "## backward ##"]))
    assert ranges.height == 2 * t.steps.height
    # each backward range spans a thousand gaps or more
    bwd = ranges.filter(pl.col("name") == "## backward ##").row(0, named=True)
    inside = gaps.filter((pl.col("start_ns") >= bwd["start_ns"]) & (pl.col("start_ns") < bwd["start_ns"] + bwd["dur_ns"]))
    assert inside.height >= 1_000
    # every kernel has its launch: correlation ids match a runtime call
    launched = t.gpu.join(t.cpu.filter(pl.col("correlation").is_not_null()), on="correlation", how="semi")
    assert launched.height == t.gpu.height


def test_analyze_peak_rss_within_bound(realistic, tmp_path):
    """`proflab analyze` in a subprocess: its peak RSS (and its helper's) stays under
    0.4 x the trace size + 300 MB, and the report is the full one."""
    out = tmp_path / "report.json"
    probe = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-m', 'proflab', 'analyze', sys.argv[1], '-f', 'json', '-o', sys.argv[2]])\n"
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    r = subprocess.run([sys.executable, "-c", probe, str(realistic), str(out)], capture_output=True, text=True,
                       timeout=300, env=_env())
    rc, maxrss_kib = map(int, r.stdout.split())
    assert rc == 0, r.stderr
    peak = maxrss_kib * 1024  # Linux reports KiB
    size = realistic.stat().st_size
    assert peak <= _bound_bytes(size), f"peak RSS {peak / 2**20:.0f} MiB > bound {_bound_bytes(size) / 2**20:.0f} MiB"
    report = json.loads(out.read_text())
    assert report["source"]["inputs"][0]["events"] > 90_000
    assert sum(report["idle"]["gaps_by_cause"].values()) > 3_000


def test_slicer_finds_the_events_array_before_a_trailing_object(tmp_path):
    """A document with an object after traceEvents (distributedInfo written last) is still
    read slice by slice, not decoded whole (which needs several times the memory)."""
    from proflab.readers import kineto

    ev = '  {\n    "ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": %d, "dur": 2\n  }'
    body = ",\n".join(ev % i for i in range(5))
    doc = '{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + body + '\n  ],\n  "distributedInfo": {\n    "rank": 0\n  }\n}\n'
    p = tmp_path / "t.json"
    p.write_text(doc)
    json.loads(doc)  # valid JSON
    doc_, tables, _ = kineto._read_sliced(p)
    assert sum(t.events for t in tables) == 5
    assert doc_.distributedInfo == {"rank": 0}
