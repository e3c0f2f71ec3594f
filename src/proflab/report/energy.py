"""The energy of a run directory with its findings: what ``proflab.energy`` returns (the public
function in ``proflab.api`` documents it). The analysis is ``analysis.energy``'s, the
``power_capped`` / ``thermal_throttled`` findings ``rules.energy``'s.
"""

from __future__ import annotations

from pathlib import Path

from proflab.analysis.energy import EnergyAnalysis, analyze_energy
from proflab.rules.energy import energy_rules

__all__ = ["energy"]


def energy(run_dir: str | Path, *, traces: list | None = None, flops_per_step: float | None = None) -> EnergyAnalysis:
    """:func:`analyze_energy` with the findings, largest estimated gain first."""
    a = analyze_energy(run_dir, traces=traces, flops_per_step=flops_per_step)
    a.findings, a.missing = energy_rules(a.monitor, power_limits_w=a.power_limits_w, idle_power_w=a.idle_power_w,
                                         default_limits_w=a.default_power_limits_w)
    a.findings.sort(key=lambda f: -f.est_gain_ms)
    return a
