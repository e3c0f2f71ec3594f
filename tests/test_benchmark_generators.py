"""The benchmarks' trace generator runs on the versions the ``bench`` extra allows, and what it
writes is a trace proflab reads with the steps it was asked for (benchmarks/gen_kineto.py,
used by bench_vs_hta.py; orjson comes from the ``bench`` extra, which CI installs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "data" / "kineto" / "train_loop.pt.trace.json.gz"


def test_gen_kineto_scales_a_real_trace(tmp_path, monkeypatch):
    pytest.importorskip("orjson", reason="the bench extra is not installed: pip install -e '.[bench]'")
    if not SOURCE.is_file():
        pytest.skip(f"{SOURCE.name} is not in tests/data/kineto/")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gen_kineto

    import proflab

    out = tmp_path / "scaled.pt.trace.json"
    summary = gen_kineto.generate(SOURCE, out, steps=2 * 5 + 3)
    assert summary["steps"] == 13 and summary["bytes"] == out.stat().st_size
    source, scaled = proflab.load(SOURCE, cache=False), proflab.load(out, cache=False)
    assert scaled.steps.height >= 13 > source.steps.height
    assert scaled.gpu.height > 2 * source.gpu.height
    sys.modules.pop("gen_kineto", None)
