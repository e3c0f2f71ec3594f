"""Issue 57's truth on the GPU: Hugging Face generate() recorded by record_inference.py --device
cuda (use_cache False/True, a static cache compiled by generate(), batch 1 and 8), each case
timed bare with CUDA events first. The issue's bars: reported TTFT, per-token time and tokens/s
within 10% of the bare measurement, each finding's gain within 15% of its fix, measured.

Written on a machine without a GPU: not yet run. A failure here is a measurement to record in
the issue, not a threshold to loosen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import proflab

pytestmark = pytest.mark.gpu

RECORDER = Path(__file__).resolve().parents[1] / "data" / "record" / "record_inference.py"
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("inference")
    subprocess.run([sys.executable, str(RECORDER), "--device", "cuda", "--out", str(out), "--batch", "1", "8",
                    "--new-tokens", str(NEW_TOKENS), "--repeats", "5", "--compress", "gz"], check=True, timeout=1800)
    truth = {c["case"]: c for c in json.loads((out / "truth.json").read_text())["cases"]}
    reports = {name: proflab.analyze(out / f"{name}.pt.trace.json.gz") for name in truth}
    return truth, reports


def _within(x: float, bare: float, pct: float) -> bool:
    return abs(x - bare) <= pct / 100 * bare


@pytest.mark.parametrize("name", ["cache-b1", "cache-b8", "nocache-b1", "nocache-b8", "static-compile-b1", "static-compile-b8"])
def test_latency_of_the_unprofiled_program_within_10_pct(recorded, name):
    truth, reports = recorded
    lat, bare = reports[name].summary["inference"]["latency"], truth[name]["bare_median"]
    lo, hi = lat["unprofiled_itl_median_ms_range"]
    # the bare per-token time lies in the estimated range, widened by the 10%
    assert 0.9 * lo <= bare["tpot_ms"] <= 1.1 * hi, (lo, hi, bare["tpot_ms"], lat["itl_median_ms"])
    if lo == hi:  # the GPU sets the pace: the estimate is a measurement
        assert _within(lo, bare["tpot_ms"], 10)


@pytest.mark.parametrize("batch", [1, 8])
def test_recompute_gain_within_15_pct_of_the_cache(recorded, batch):
    truth, reports = recorded
    found = [f for f in reports[f"nocache-b{batch}"].findings if f.category == "kv_cache_recompute"]
    measured_ms = (truth[f"nocache-b{batch}"]["bare_median"]["tpot_ms"] - truth[f"cache-b{batch}"]["bare_median"]["tpot_ms"]) * (NEW_TOKENS - 1)
    if measured_ms <= 0.01 * truth[f"nocache-b{batch}"]["bare_median"]["e2e_ms"]:
        assert not found  # recomputing costs nothing measurable here: nothing may be claimed
        return
    (f,) = found
    assert _within(f.est_gain_ms, measured_ms, 15), (f.est_gain_ms, measured_ms)


def test_launch_bound_decode_gain_within_15_pct_of_the_compiled_static_cache(recorded):
    truth, reports = recorded
    found = {f.id: f for f in reports["cache-b1"].findings}
    assert "decode_launch_bound" in found
    d = reports["cache-b1"].summary["inference"]["utilisation"]["decode"]
    assert d["gpu_busy_pct"] < 50
    measured_ms = (truth["cache-b1"]["bare_median"]["tpot_ms"] - truth["static-compile-b1"]["bare_median"]["tpot_ms"]) * (NEW_TOKENS - 1)
    f = found["decode_launch_bound"]
    if reports["cache-b1"].summary.get("gain_per") == "step":  # no steps recorded: its tokens are its steps, the gain a token's
        measured_ms /= NEW_TOKENS - 1
    assert _within(f.est_gain_ms, measured_ms, 15), (f.est_gain_ms, measured_ms, f.prediction)
    # the fix applied: the graphed decode is not launch-bound
    assert "decode_launch_bound" not in {f.id for f in reports["static-compile-b1"].findings}


def test_decode_bandwidth_is_read_against_the_device(recorded):
    _, reports = recorded
    inf = reports["cache-b8"].summary["inference"]
    d = inf["utilisation"]["decode"]
    assert d["hbm_peak_gbps"] and 0 < d["mbu_pct"] < 100
    f = pl.DataFrame(inf["per_forward"])
    assert (f.filter(pl.col("phase") == "decode")["gpu_ms"] > 0).all()
