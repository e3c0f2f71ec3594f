"""A trace of one profiled step says what its GPU-side window cannot hold (real data: timm's ViT
with a DataLoader without workers, killed at its fourth step by a time limit, so its trace has
one profiled step: 421.6 ms of host step over 61.6 ms of GPU work; kept in tests/data/one_step when
the third-party set's timm run was recorded again in full)."""

from __future__ import annotations

from pathlib import Path

import proflab

DATA = Path(__file__).parent / "data"


def _missing(trace: Path) -> dict:
    report = proflab.analyze(proflab.load(trace))
    return {m["signal"]: m["reason"] for m in report.to_dict()["missing"]}


def test_one_step_whose_host_outlasts_its_kernels_says_the_wait_before_them_is_in_no_step():
    why = _missing(DATA / "one_step" / "timm_vit.base.pt.trace.json.xz")["the wait before the step's first kernel"]
    assert "61.585 ms" in why and "421.571 ms" in why and "--active 3" in why


def test_a_trace_of_several_steps_says_nothing_of_it():
    assert "the wait before the step's first kernel" not in _missing(DATA / "thirdparty" / "tv_resnet.base" / "traces" / "tv_resnet.base.pt.trace.json.xz")
