"""Energy rules: ``power_capped`` and ``thermal_throttled`` from the GPU monitor's samples.

Pure: a monitor frame (the columns of ``proflab.collect.monitor.COLUMNS``) and the power
limits in, findings and missing signals out. Only samples where the GPU was running work
(``util_gpu_pct > 0``) count: an idle GPU drops its clocks by design.

Evidence per device: the share of busy time under the reason, the SM clock under it against
the busy, unthrottled clock (the loss), power against the limit, temperature. The time cost
assumes the work's speed follows the SM clock (an upper bound: memory-bound work slows less);
the energy cost is that extra time at the device's idle power (what the board draws just
being on longer), a lower bound, since the work itself is not free either.

A power cap is the user's to fix only where the limit was lowered below the board's default
(``default_limits_w``: NVML's default, or the datasheet's maximum TDP): then it is a finding
like any, up to critical, and its fix is the default limit back. At the default the work is
power-bound: an ``info`` finding that says so, with no gain claimed (no limit change is
possible), and what lowers energy per result. Where the default is not known, at most a
warning that says to check.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import polars as pl

from proflab.model.findings import Finding, Missing
from proflab.rules._common import MIN_GAIN_PCT, gain_finding

__all__ = ["energy_rules", "POWER_BITS", "THERMAL_BITS"]

POWER_BITS = {0x4: "sw_power_cap", 0x80: "hw_power_brake_slowdown"}
THERMAL_BITS = {0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x8: "hw_slowdown"}


# A limit within this share of the board's default is the default (NVML reports limits in mW;
# some boards' defaults are a few watts off their datasheet's round figure).
_AT_DEFAULT = 0.98
_ENERGY_PER_RESULT = (
    "energy per result falls with less work or fewer bytes per result: lower precision where it is "
    "accurate enough (bf16, fp8), fused kernels and larger batches that reuse data; at the power limit the last "
    "MHz cost the most joules, so a lower clock or power cap (nvidia-smi -lgc / -pl) often does the same work in "
    "fewer joules at a small cost in time"
)


def _power_capped(dev: int, ev: dict[str, Any], gain_ns: float, wall_ns: int, limit_w: float | None,
                  default: tuple[float, str] | None) -> Finding:
    """The power cap by whose limit it is: lowered below the board's default (the user's to
    raise: a finding like any), at the default (power-bound: info, no gain), or unknown."""
    held = (f"held at {ev['sm_clock_throttled_mhz']:.0f} MHz for {ev['busy_time_share_pct']}% of its busy time "
            f"({ev['clock_loss_pct']}% clock loss)")
    default_w, source = default if default is not None else (None, None)
    ev = {**ev, "power_limit_default_w": _r(default_w, 1), "power_limit_default_source": source}
    assumption = ("the work's speed follows the SM clock (an upper bound: memory-bound work slows less); the energy "
                  "cost is the extra time at the GPU's idle power, a lower bound; gain is against the GPU's busy time "
                  "in the monitored run")
    common = {"id": f"power_capped:gpu{dev}", "evidence": ev, "where": {"devices": [dev]}}
    if default_w is not None and limit_w is not None and limit_w < _AT_DEFAULT * default_w:
        ev["power_limit_lowered"] = True
        return gain_finding(
            "power_capped", gain_ns, wall_ns, **common,
            title=f"GPU {dev} {held} by a power limit lowered to {limit_w:.0f} W (the board's default: {default_w:.0f} W)",
            fix=(f"raise the power limit to the board's default: nvidia-smi -i {dev} -pl {default_w:.0f} (as root; check "
                 "first whether it was lowered on purpose, for cooling or the power budget of the rack)"),
            assumption=assumption,
        )
    if default_w is not None and limit_w is not None:
        ev["power_limit_lowered"] = False
        ev["clock_loss_gain_ms"] = _r(gain_ns / 1e6)
        return gain_finding(
            "power_capped", 0, wall_ns, **common,
            title=f"GPU {dev} is power-bound at its default {limit_w:.0f} W limit: {held}",
            fix=f"the limit is the board's default, so the clock it holds is the board's own: {_ENERGY_PER_RESULT}",
            assumption="at the board's default limit no change of the limit is possible: no gain is claimed",
        )
    ev["power_limit_lowered"] = None
    f = gain_finding(
        "power_capped", gain_ns, wall_ns, **common,
        title=f"GPU {dev} {held} by its power limit" + (f" ({limit_w:.0f} W)" if limit_w else "")
        + "; the board's default limit is not known",
        fix=("check the power limit against the board's default (nvidia-smi -q -d POWER: Current vs Default Power "
             f"Limit): raise it to the default if it was lowered; at the default the work is power-bound: {_ENERGY_PER_RESULT}"),
        assumption=assumption,
    )
    # whether the user can act is unknown: at most a warning
    return dataclasses.replace(f, severity="warning") if f.severity == "critical" else f


def _r(v, nd=3):
    return None if v is None else round(float(v), nd)


def energy_rules(monitor: pl.DataFrame, *, power_limits_w: dict[int, float] | None = None,
                 idle_power_w: dict[int, float | None] | None = None,
                 default_limits_w: dict[int, tuple[float, str]] | None = None) -> tuple[list[Finding], list[Missing]]:
    """``power_capped`` / ``thermal_throttled`` findings, one per device affected, and the
    signals the GPUs did not report (missing is not zero). ``default_limits_w``: per device,
    the board's default power limit (W) and where it comes from."""
    findings: list[Finding] = []
    missing: list[Missing] = []
    limits = power_limits_w or {}
    idle = idle_power_w or {}
    defaults = default_limits_w or {}
    for (dev,), d in monitor.sort("device", "time_ns").group_by("device", maintain_order=True):
        dev = int(dev)
        for col in ("throttle_mask", "sm_clock_mhz", "util_gpu_pct"):
            if col not in d.columns:
                d = d.with_columns(pl.lit(None, pl.Float64 if col != "throttle_mask" else pl.UInt64).alias(col))
        if d["throttle_mask"].null_count() == d.height:
            missing.append(Missing("throttle_reasons", f"GPU {dev} reported no clock-event (throttle) reasons",
                                   ("power_capped", "thermal_throttled")))
            continue
        if d["sm_clock_mhz"].null_count() == d.height:
            missing.append(Missing("sm_clock", f"GPU {dev} reported no SM clock: the clock loss cannot be measured",
                                   ("power_capped", "thermal_throttled")))
            continue
        t = d["time_ns"].to_numpy().astype(np.float64) / 1e9
        dt = np.diff(t, append=t[-1])  # each sample stands for the interval after it
        mask = d["throttle_mask"].fill_null(0).to_numpy().astype(np.int64)
        util = d["util_gpu_pct"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
        if np.isnan(util).all():
            missing.append(Missing("util_gpu_pct", f"GPU {dev} reported no utilisation: busy time unknown",
                                   ("power_capped", "thermal_throttled")))
            continue
        known = d["throttle_mask"].is_not_null().to_numpy()
        busy = (np.nan_to_num(util) > 0) & known  # a sample with no throttle reading is not judged
        busy_s = float(dt[busy].sum())
        if busy_s <= 0:
            continue
        clock = d["sm_clock_mhz"].to_numpy().astype(np.float64)
        for category, bits in (("power_capped", POWER_BITS), ("thermal_throttled", THERMAL_BITS)):
            hit = busy & ((mask & sum(bits)) != 0)
            if not hit.any():
                continue
            f = _finding(category, dev, d, hit, busy, dt, clock, mask, bits, busy_s,
                         limits.get(dev), idle.get(dev), defaults.get(dev))
            if f is not None:
                findings.append(f)
    return findings, missing


def _finding(category, dev, d, hit, busy, dt, clock, mask, bits, busy_s, limit_w, idle_w, default=None) -> Finding | None:
    free = busy & ~hit & ((mask & (sum(POWER_BITS) | sum(THERMAL_BITS))) == 0)
    ref = float(np.nanmedian(clock[free])) if free.any() else float(np.nanmax(clock))
    ref_src = "median SM clock of busy samples with no throttle reason" if free.any() else "highest SM clock seen"
    under = float(np.nanmedian(clock[hit]))
    loss = max(0.0, 1 - under / ref) if ref > 0 else 0.0
    hit_s = float(dt[hit].sum())
    extra_s = hit_s * loss / (1 - loss) if loss < 1 else 0.0  # work at `under` takes ref/under as long
    reasons = sorted({name for bit, name in bits.items() if (mask[hit] & bit).any()})
    power = d["power_w"].to_numpy().astype(np.float64)
    temp = d["temp_c"].to_numpy().astype(np.float64) if "temp_c" in d.columns else np.full(len(power), np.nan)
    ev: dict[str, Any] = {
        "device": dev,
        "reasons": reasons,
        "throttled_s": _r(hit_s),
        "busy_s": _r(busy_s),
        "busy_time_share_pct": _r(100 * hit_s / busy_s, 1),
        "sm_clock_throttled_mhz": _r(under, 0),
        "sm_clock_reference_mhz": _r(ref, 0),
        "sm_clock_reference": ref_src,
        "clock_loss_pct": _r(100 * loss, 1),
        "power_throttled_w": None if np.isnan(power[hit]).all() else _r(np.nanmedian(power[hit]), 1),
        "power_limit_w": _r(limit_w, 1),
        "temp_throttled_c": None if np.isnan(temp[hit]).all() else _r(np.nanmedian(temp[hit]), 1),
        "max_temp_c": None if np.isnan(temp).all() else _r(np.nanmax(temp), 1),
        "est_energy_cost_j": None if idle_w is None else _r(extra_s * idle_w, 1),
    }
    if limit_w and ev["power_throttled_w"] is not None:
        ev["power_of_limit_pct"] = _r(100 * ev["power_throttled_w"] / limit_w, 1)
    wall_ns = int(busy_s * 1e9)
    gain_ns = extra_s * 1e9
    if 100 * gain_ns / wall_ns < MIN_GAIN_PCT:
        return None
    if category == "power_capped":
        return _power_capped(dev, ev, gain_ns, wall_ns, limit_w, default)
    else:
        title = (f"GPU {dev} slowed by heat for {ev['busy_time_share_pct']}% of its busy time "
                 f"({ev['clock_loss_pct']}% clock loss, up to {ev['max_temp_c']} C)")
        fix = "check cooling: airflow, fan curve, inlet temperature, dust; a GPU that runs hot slows itself"
    return gain_finding(
        category, gain_ns, wall_ns, id=f"{category}:gpu{dev}", title=title, evidence=ev, fix=fix,
        where={"devices": [dev]},
        assumption=("the work's speed follows the SM clock (an upper bound: memory-bound work slows less); the "
                    "energy cost is the extra time at the GPU's idle power, a lower bound; gain is against the GPU's "
                    "busy time in the monitored run"),
    )
