"""Issue 57's bars on a recording made after the unprofiled estimate was set
(tests/data/inference/h100-heldout): the 156 M-parameter Llama of tests/data/inference/h100 at
batch 1 and 8, recorded again on another H100 by tests/gpu/test_inference_live.py's command
(``record_inference.py --device cuda --batch 1 8 --new-tokens 32 --repeats 5``), analysed once.
The GPU test's checks run here on what it recorded; the known misses are strict expected
failures with their numbers (benchmarks/inference_truth.py prints the table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import proflab
from committed import committed  # noqa: E402  (tests/, on the path)

HELDOUT = Path(__file__).parent / "data" / "inference" / "h100-heldout"
TRUTH = {c["case"]: c for c in json.loads((HELDOUT / "truth.json").read_text())["cases"]}
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def reports():
    return {}


def _report(reports, case: str):
    if case not in reports:
        reports[case] = proflab.analyze(proflab.load(committed(HELDOUT, case)))
    return reports[case]


def _miss(why: str):
    return pytest.mark.xfail(strict=True, reason=f"a known miss: {why} (benchmarks/inference_truth.py)")


@pytest.mark.parametrize("case", [
    "cache-b1", "static-compile-b1", "nocache-b8", "static-compile-b8",
    pytest.param("nocache-b1", marks=_miss("4.45 ms against 5.87 bare (-24%): the profiler's start-up measured 1.69 ms on "
                                           "generate()'s first copy here (0.39-0.43 in the other cases); the estimate "
                                           "before it is taken off reads 6.14 (+5%)")),
    pytest.param("cache-b8", marks=_miss("5.53 ms against 6.21 bare (-11%)")),
])
def test_the_unprofiled_ttft_is_within_10_percent(reports, case):
    lat = _report(reports, case).summary["inference"]["latency"]
    assert lat["unprofiled_ttft_ms"] == pytest.approx(TRUTH[case]["bare_median"]["ttft_ms"], rel=0.10)
    assert lat["ttft_ms"] > 1.5 * TRUTH[case]["bare_median"]["ttft_ms"]  # (the profiled TTFT)


@pytest.mark.parametrize("case", [
    "cache-b1", "cache-b8", "nocache-b1", "nocache-b8", "static-compile-b1",
    pytest.param("static-compile-b8", marks=_miss("TPOT 1.403 ms against 1.677 bare (-16%); the bare rounds after the "
                                                  "first (compiling) one took 1.45-1.75")),
])
def test_the_unprofiled_tpot_and_tokens_per_s_are_within_10_percent(reports, case):
    lat, bare = _report(reports, case).summary["inference"]["latency"], TRUTH[case]["bare_median"]
    assert lat["unprofiled_tpot_ms"] == pytest.approx(bare["tpot_ms"], rel=0.10)
    assert lat["unprofiled_output_tokens_per_s"] == pytest.approx(bare["output_tokens_per_s"], rel=0.10)
    assert lat["tpot_ms"] > 1.3 * bare["tpot_ms"]  # (the profiled figure is not: the profiler's cost is in it)
    lo, hi = lat["unprofiled_itl_median_ms_range"]
    assert 0.9 * lo <= bare["tpot_ms"] <= 1.1 * hi  # (the GPU test's bar: the bare token in the range)


def test_the_static_caches_gain_is_predicted_within_15_percent(reports):
    """decode_launch_bound on the cached decode at batch 1: the static cache compiled by
    generate() saved 4.01 ms a token bare (TPOT 5.32 -> 1.32 ms); the finding predicts 4.02."""
    found = {f.id: f for f in _report(reports, "cache-b1").findings}
    measured = TRUTH["cache-b1"]["bare_median"]["tpot_ms"] - TRUTH["static-compile-b1"]["bare_median"]["tpot_ms"]
    assert found["decode_launch_bound"].est_gain_ms == pytest.approx(measured, rel=0.15)
    assert "decode_launch_bound" not in {f.id for f in _report(reports, "static-compile-b1").findings}


@pytest.mark.parametrize("batch", [1, 8])
def test_a_cache_that_saves_nothing_is_not_claimed(reports, batch):
    """Without a cache the host-bound decode recomputed its context in the time the cached one
    took (5.14 against 5.32 ms a token at batch 1, 5.55 against 5.61 at batch 8, bare): no
    recompute finding claims a gain."""
    nocache, cache = (TRUTH[f"{v}-b{batch}"]["bare_median"]["tpot_ms"] for v in ("nocache", "cache"))
    assert nocache <= cache
    assert not [f for f in _report(reports, f"nocache-b{batch}").findings if f.id == "kv_cache_recompute"]
