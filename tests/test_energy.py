"""Energy of a run directory (analysis/energy.py, rules/energy.py, `proflab energy`).

Real inputs: the two recorded run directories (an H100 training loop and a 2x H200 DDP run),
each with monitor.parquet and torch.profiler traces. Neither run was throttled and their
profiled windows are shorter than the energy counter's resolution, so the accepting paths
(window energy, per-step energy, the throttle findings) are tested on samples marked
SIMULATED below, built from the real frames: a throttled GPU and a 1 ms counter cannot be
produced without a GPU.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import proflab
from proflab.analysis.energy import analyze_energy, counter_resolution, span_energy_j
from proflab.cli import main
from proflab.rules.energy import energy_rules

RUNS = Path(__file__).parent / "data" / "runs"
H100 = RUNS / "20261122-074634-h100_cuda_train"
DDP = RUNS / "20261122-082928-h200x2_ddp"


@pytest.fixture(scope="module")
def h100():
    return proflab.energy(H100)


@pytest.fixture(scope="module")
def ddp():
    return proflab.energy(DDP)


def _counter_delta(run: Path, dev: int) -> float:
    d = pl.read_parquet(run / "monitor.parquet").filter(pl.col("device") == dev).sort("time_ns")
    return float(d["energy_j"][-1] - d["energy_j"][0])


def test_run_energy_is_the_counter_with_integrated_power_as_cross_check(h100):
    (d,) = h100.devices
    assert d["energy_source"] == "counter"
    assert d["energy_j"] == pytest.approx(_counter_delta(H100, 0), abs=1e-3)
    assert d["energy_j"] == pytest.approx(1056.4, abs=0.1)  # the recorded run's meta.json says 1056.409
    # the one-second-averaged power integrates to within a few % of the counter
    assert abs(d["counter_vs_integrated_pct"]) < 3
    assert d["mean_power_w"] == pytest.approx(d["energy_j"] / d["duration_s"], rel=1e-3)
    assert d["peak_power_w"] >= d["mean_power_w"]
    assert d["power_limit_w"] == 700.0


def test_counter_resolution_from_the_recorded_samples(h100, ddp):
    for d in h100.devices + ddp.devices:
        # the counter changed at (nearly) every 100 ms sample: its own interval is hidden below that
        assert d["sample_period_s"] == pytest.approx(0.1, abs=0.005)
        assert d["resolution_s"] == pytest.approx(0.1, abs=0.005)
        assert d["resolved"] is False
        assert d["changes"] >= 0.9 * (d["samples"] - 1)


def test_counter_resolution_sees_a_coarser_counter():
    # SIMULATED: the real H100 counter held for 5 samples at a time (a counter updating every 0.5 s)
    d = pl.read_parquet(H100 / "monitor.parquet").sort("time_ns")
    held = d.with_columns(pl.col("energy_j").gather((pl.int_range(pl.len()) // 5) * 5))
    r = counter_resolution(held)
    assert r["resolved"] is True
    assert r["counter_update_s"] == pytest.approx(0.5, abs=0.02)
    assert r["resolution_s"] == pytest.approx(0.5, abs=0.02)


def test_idle_energy(h100, ddp):
    for d in h100.devices + ddp.devices:
        assert 0 < d["energy_idle_j"] <= d["energy_j"]
        assert 0 < d["idle_s"] <= d["duration_s"]
        assert d["idle_power_w"] == pytest.approx(d["energy_idle_j"] / d["idle_s"], rel=1e-2)
    # the recorded loops are short and mostly idle: most of the energy is spent with no kernel running
    assert h100.devices[0]["idle_energy_pct"] > 50


def test_windows_are_aligned_and_refused_below_the_counter_resolution(h100, ddp):
    for a in (h100, ddp):
        for w in a.windows:
            assert w["aligned"] is True
            assert 0 < w["window_offset_s"] < a.devices[0]["duration_s"]
            assert w["window_s"] < 0.1  # 8.7 ms and 33-34 ms windows
            assert w["window_energy_j"] is None and w["energy_per_step_j"] is None
            assert "shorter than the energy counter's resolution" in w["refused"]
            assert w["steps"] == 5 and w["steps_refused"] == 5
            assert w["tflops_per_w"] is None
    # the MLP's FLOPs are known from its shapes (forward 2 GEMMs, backward 3: the first layer's
    # input needs no gradient; its element-wise operators add 0.03 %), yet the steps are too
    # short for energy, so no TFLOPS/W
    for w in h100.windows:
        assert w["flop_per_step"] == pytest.approx(5 * 2 * 256 * 2048 * 4096, rel=1e-3) and "shapes" in w["flop_source"]
        assert "no TFLOPS/W" in w["flop_missing"]


def test_ddp_per_rank(ddp):
    assert [d["device"] for d in ddp.devices] == [0, 1]
    assert sorted((w["rank"], w["device"]) for w in ddp.windows) == [(0, 0), (1, 1)]
    assert ddp.energy_j == pytest.approx(_counter_delta(DDP, 0) + _counter_delta(DDP, 1), abs=1e-2)


def test_a_trace_outside_the_monitor_span_is_not_aligned():
    t = proflab.load(next((H100 / "traces").glob("*.pt.trace.json.gz")))
    shifted = dataclasses.replace(t, meta=dataclasses.replace(t.meta, base_time_ns=t.meta.base_time_ns - 3600 * 10**9))
    a = analyze_energy(H100, traces=[shifted])
    (w,) = a.windows
    assert w["aligned"] is False and w["window_energy_j"] is None
    assert "outside the monitor's span" in w["refused"]


def test_span_energy_is_the_counter_difference_between_samples():
    d = pl.read_parquet(H100 / "monitor.parquet").sort("time_ns")
    t, e = d["time_ns"].to_list(), d["energy_j"].to_list()
    assert span_energy_j(d, t[10], t[40]) == pytest.approx(e[40] - e[10])
    mid = (t[10] + t[11]) // 2
    assert e[10] < span_energy_j(d, t[0], mid) + e[0] < e[11]
    assert span_energy_j(d, t[0] - 1, t[5]) is None  # before the first sample: unknown


def test_window_and_step_energy_when_the_counter_resolves_them(tmp_path):
    # SIMULATED monitor: 1.6 ms samples at a constant 250 W around the real H100 trace's window
    t = proflab.load(next((H100 / "traces").glob("*.pt.trace.json.gz")))
    t0, t1 = t.window_ns
    base = t.meta.base_time_ns
    ts = np.arange(base + t0 - 50_000_000, base + t1 + 50_000_000, 1_600_000, dtype=np.int64)
    mon = pl.DataFrame({"device": np.zeros(len(ts), dtype=np.int32), "time_ns": ts,
                        "power_w": np.full(len(ts), 250.0), "energy_j": (ts - ts[0]) / 1e9 * 250.0,
                        "util_gpu_pct": np.full(len(ts), 50.0)})
    mon.write_parquet(tmp_path / "monitor.parquet")
    a = analyze_energy(tmp_path, traces=[t])
    (w,) = a.windows
    assert a.devices[0]["resolution_s"] == pytest.approx(0.0016, rel=0.01)
    assert w["refused"] is None
    assert w["window_energy_j"] == pytest.approx(250.0 * w["window_s"], rel=0.02)
    assert w["window_mean_power_w"] == pytest.approx(250.0, rel=0.02)
    # per step: the steps' span at 250 W over 5 steps
    assert w["energy_per_step_j"] == pytest.approx(250.0 * w["steps_span_s"] / 5, rel=0.02)
    assert w["steps_with_energy"] + w["steps_refused"] == 5
    # the recorded GPU-side steps: 2.18, 1.55, 1.65, 1.52, 1.47 ms; those under 1.6 ms get none
    assert (w["steps_with_energy"], w["steps_refused"]) == (2, 3)


# -- rules -------------------------------------------------------------------------------------


def test_recorded_runs_have_the_signals_and_no_throttle_finding(h100, ddp):
    for a in (h100, ddp):
        assert a.findings == [] and a.missing == []
        for d in a.devices:
            assert d["throttle_reasons_seen"] is not None  # reported, not missing
            assert not {"sw_power_cap", "hw_thermal_slowdown", "sw_thermal_slowdown"} & set(d["throttle_reasons_seen"])
    assert "gpu_idle" in h100.devices[0]["throttle_reasons_seen"]


def _simulated_throttle(bit: int, *, temp_c: float = 60.0) -> pl.DataFrame:
    """SIMULATED throttle on the real H100 frame: busy (90 %) from 2 s to 6 s at 1980 MHz, and in
    its second half `bit` set with the SM clock at 1400 MHz, 690 W and `temp_c`."""
    d = pl.read_parquet(H100 / "monitor.parquet").sort("time_ns")
    s = pl.col("elapsed_s")
    busy = (s >= 2) & (s < 6)
    hit = (s >= 4) & (s < 6)
    return d.with_columns(
        pl.when(busy).then(90.0).otherwise(0.0).alias("util_gpu_pct"),
        pl.when(hit).then(pl.lit(bit, pl.UInt64)).otherwise(pl.lit(0, pl.UInt64)).alias("throttle_mask"),
        pl.when(hit).then(1400.0).otherwise(1980.0).alias("sm_clock_mhz"),
        pl.when(hit).then(690.0).otherwise(pl.col("power_w")).alias("power_w"),
        pl.when(hit).then(temp_c).otherwise(pl.col("temp_c")).alias("temp_c"),
    )


def test_power_capped_on_a_simulated_throttle():
    """A limit lowered below the board's default (500 of 700 W): the user's to raise, a
    finding like any, critical at ~20 % of the busy time."""
    f, missing = energy_rules(_simulated_throttle(0x4), power_limits_w={0: 500.0}, idle_power_w={0: 80.0},
                              default_limits_w={0: (700.0, "NVML's default limit for the board")})
    assert missing == []
    (p,) = f
    ev = p.evidence
    assert p.category == "power_capped" and ev["reasons"] == ["sw_power_cap"]
    assert ev["busy_time_share_pct"] == pytest.approx(50, abs=3)
    assert ev["clock_loss_pct"] == pytest.approx(100 * (1 - 1400 / 1980), abs=0.1)
    assert ev["power_of_limit_pct"] == pytest.approx(138.0, abs=0.1)
    extra_s = ev["throttled_s"] * (1980 / 1400 - 1)
    assert p.est_gain_ms == pytest.approx(extra_s * 1e3, rel=0.01)
    assert ev["est_energy_cost_j"] == pytest.approx(extra_s * 80.0, rel=0.01)
    assert p.severity == "critical"  # ~20 % of the busy time
    assert ev["power_limit_lowered"] is True and "lowered to 500 W" in p.title and "-pl 700" in p.fix


def test_power_at_the_boards_default_limit_is_power_bound_not_critical():
    """The same throttle at the board's default limit: the user cannot act on the limit, so
    it is an info finding that the work is power-bound, with no gain claimed and what lowers
    energy per result; the clock loss stays in its evidence."""
    f, _ = energy_rules(_simulated_throttle(0x4), power_limits_w={0: 700.0}, idle_power_w={0: 80.0},
                        default_limits_w={0: (700.0, "NVML's default limit for the board")})
    (p,) = f
    assert p.category == "power_capped" and p.severity == "info" and p.est_gain_ms == 0 and p.est_gain_pct == 0
    assert "power-bound at its default 700 W limit" in p.title
    assert "energy per result" in p.fix and "bf16" in p.fix and "-pl 700" not in p.fix
    assert p.evidence["power_limit_lowered"] is False and p.evidence["clock_loss_pct"] > 25


def test_power_cap_whose_default_is_unknown_is_at_most_a_warning():
    f, _ = energy_rules(_simulated_throttle(0x4), power_limits_w={0: 700.0}, idle_power_w={0: 80.0})
    (p,) = f
    assert p.severity == "warning" and "default limit is not known" in p.title
    assert p.evidence["power_limit_lowered"] is None and p.est_gain_ms > 0


def test_the_boards_default_comes_from_nvml_else_the_datasheet():
    from proflab.analysis.devices import default_power_limit_w
    from proflab.analysis.energy import _default_limits

    assert default_power_limit_w("NVIDIA H200") == 700 and default_power_limit_w("NVIDIA H100 PCIe") == 350
    assert default_power_limit_w("NVIDIA A100-SXM4-80GB") == 400 and default_power_limit_w("NVIDIA L4") == 72
    assert default_power_limit_w("NVIDIA GH200 480GB") is None and default_power_limit_w(None) is None
    meta = {"gpu": {"gpus": [{"index": 0, "name": "NVIDIA H200", "power_limit_default_w": 650.0},
                             {"index": 1, "name": "NVIDIA H200"}, {"index": 2, "name": "Some GPU"}]}}
    got = _default_limits(meta)
    assert got[0] == (650.0, "NVML's default limit for the board") and got[1][0] == 700.0 and "datasheet" in got[1][1]
    assert 2 not in got


def test_thermal_throttled_on_a_simulated_throttle():
    f, _ = energy_rules(_simulated_throttle(0x20, temp_c=88.0), power_limits_w={0: 700.0})
    (t,) = f
    assert t.category == "thermal_throttled" and t.evidence["reasons"] == ["sw_thermal_slowdown"]
    assert t.evidence["temp_throttled_c"] == 88.0 and t.evidence["max_temp_c"] == 88.0
    assert t.evidence["est_energy_cost_j"] is None  # no idle power given: unknown, not zero


def test_throttle_while_idle_is_not_a_finding():
    d = _simulated_throttle(0x4).with_columns(pl.lit(0.0).alias("util_gpu_pct"))
    assert energy_rules(d) == ([], [])


def test_missing_throttle_reasons_is_missing_not_none():
    d = _simulated_throttle(0x4).with_columns(pl.lit(None, pl.UInt64).alias("throttle_mask"))
    f, missing = energy_rules(d)
    assert f == []
    assert [m.signal for m in missing] == ["throttle_reasons"]


# -- CLI -----------------------------------------------------------------------------------------


def _validator():
    import jsonschema

    schema = json.loads(resources.files("proflab").joinpath("schema/energy.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("run", [H100, DDP], ids=["h100", "h200x2"])
def test_cli_json_validates(run, capsys):
    assert main(["energy", str(run), "-f", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    _validator().validate(doc)
    assert doc["schema"] == "proflab.energy/1"


def test_schema_accepts_a_finding_and_rejects_a_broken_document(h100):
    doc = h100.to_dict()
    f, _ = energy_rules(_simulated_throttle(0x4), power_limits_w={0: 500.0}, idle_power_w={0: 80.0},
                        default_limits_w={0: (700.0, "NVML's default limit for the board")})
    doc["findings"] = [x.to_dict() for x in f]
    v = _validator()
    v.validate(doc)
    doc["devices"][0]["energy_j"] = "lots"
    assert list(v.iter_errors(doc))


def test_cli_terminal_and_markdown(capsys, tmp_path):
    assert main(["energy", str(DDP)]) == 0
    out = capsys.readouterr().out
    assert "GPU 1: 1,548.2 J" in out and "rank 1" in out and "refused:" in out
    assert main(["energy", str(H100), "-o", str(tmp_path / "e.md")]) == 0
    assert (tmp_path / "e.md").read_text().startswith("# proflab energy")


def test_analyze_run_dir_has_an_energy_section(capsys):
    assert main(["analyze", str(H100)]) == 0
    out = capsys.readouterr().out
    assert "\nEnergy\n" in out and "1,056.4 J" in out


@pytest.mark.parametrize("make, says", [
    (lambda p: p, "no monitor.parquet"),
    (lambda p: (p / "monitor.parquet").write_bytes(b"PAR1 not really"), "not a readable parquet"),
    (lambda p: pl.DataFrame({"x": [1]}).write_parquet(p / "monitor.parquet"), "not GPU monitor samples"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, says):
    make(tmp_path)
    assert main(["energy", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_not_a_directory(tmp_path, capsys):
    assert main(["energy", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_analyze_ddp_run_dir_markdown_has_the_energy_section(capsys):
    assert main(["analyze", str(DDP), "-f", "md"]) == 0
    out = capsys.readouterr().out
    assert "## Energy" in out and "rank 0" in out and "rank 1" in out


def test_analyze_survives_a_broken_monitor_file(tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(H100, run)
    (run / "monitor.parquet").write_bytes(b"PAR1 truncated")
    assert main(["analyze", str(run)]) == 0  # the trace analysis stands; energy says why it is absent
    out = capsys.readouterr().out
    assert "Energy: not analysed" in out and "not a readable parquet" in out


def test_a_monitor_without_throttle_columns_is_missing_not_unthrottled():
    d = _simulated_throttle(0x4).drop("throttle_mask", "throttle")
    f, missing = energy_rules(d)
    assert f == [] and [m.signal for m in missing] == ["throttle_reasons"]
