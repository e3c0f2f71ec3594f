"""The terminal summary opens with a verdict: healthy, or the top problem and its saving."""
from __future__ import annotations

import re

from pathlib import Path

from proflab.cli import main

KINETO = Path(__file__).parent / "data" / "kineto"


def _verdict(capsys, name: str) -> str:
    assert main(["analyze", str(KINETO / name)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("Verdict: ")]
    assert len(lines) == 1
    return lines[0]


def test_healthy_run(capsys):
    assert _verdict(capsys, "healthy_bf16_gemm.pt.trace.json.gz").startswith("Verdict: healthy — ")


def test_problem_run_names_its_top_cause_and_saving(capsys):
    line = _verdict(capsys, "pageable_h2d.pt.trace.json.gz")
    assert re.match(r"Verdict: pageable_memcpy — fixing it saves [\d.,]+ ms a step \([\d.]+%, predicted\)$", line), line
