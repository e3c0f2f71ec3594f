"""A compiled program on the GPU under ``proflab run``: compiled inside and outside the window,
its bare step equal to the plain run's, Dynamo's counters equal, and the report recognising
the compiled regions and CUDA graph replays (``mode="reduce-overhead"``) and advising what
fits what the program already does. Runs nanoGPT's GPT at small sizes (record_compiled.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import proflab

pytestmark = pytest.mark.gpu
RECORDER = Path(__file__).resolve().parents[1] / "data" / "record" / "record_compiled.py"


@pytest.fixture(scope="module", params=["compile", "reduce-overhead"])
def recorded(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    done = subprocess.run([sys.executable, str(RECORDER), "--out", str(out), "--steps", "80", "--only", request.param],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return request.param, out, json.loads((out / "compiled.json").read_text())["variants"][request.param]


def test_proflab_leaves_the_program_compiled_and_as_fast(recorded):
    variant, _, r = recorded
    # (an empty counter is Dynamo's defaultdict touched by a cache miss: the same as none)
    for key in ("frames", "graph_break", "recompiles"):
        assert (r["counters_under_proflab"].get(key) or {}) == (r["counters_plain"].get(key) or {}), key
    plain = sorted(r["plain_median_ms"])
    # the program's own timer under proflab, within the spread of its two plain runs and 10 %
    assert plain[0] * 0.9 <= r["program_median_under_proflab_ms"] <= plain[1] * 1.1
    assert r["proflab_flops"]["compiled"] is True and r["proflab_flops"]["total"] > 0


def test_the_report_recognises_compiled_code_and_never_advises_compiling_it(recorded):
    pytest.importorskip("polars", reason="the analysis needs polars (the recording above does not)")
    variant, out, _ = recorded
    report = proflab.analyze(out / f"nanogpt.{variant}.pt.trace.json.gz")
    c = report.summary["compiled"]
    assert c["compiled"] and c["regions"] >= 1 and c["kernels"]["triton"] > 0
    assert c["graphed"] is (variant == "reduce-overhead")
    for f in report.findings:
        assert "fuse them into a few kernels with torch.compile" not in f.fix
