"""Shared helpers for rules: severity from estimated gain, unit conversions."""

from __future__ import annotations

from proflab.report import Severity

# Below this share of the window a problem is not material and gets no finding.
MIN_GAIN_PCT = 1.0
WARNING_PCT = 5.0
CRITICAL_PCT = 20.0


def severity(gain_pct: float) -> Severity:
    if gain_pct >= CRITICAL_PCT:
        return "critical"
    if gain_pct >= WARNING_PCT:
        return "warning"
    return "info"


def ms(ns: float | int | None, nd: int = 3) -> float | None:
    return None if ns is None else round(float(ns) / 1e6, nd)


def us(ns: float | int | None, nd: int = 2) -> float | None:
    return None if ns is None else round(float(ns) / 1e3, nd)


def pct(part: float, whole: float, nd: int = 1) -> float:
    return round(100.0 * part / whole, nd) if whole else 0.0
