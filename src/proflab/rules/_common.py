"""Shared helpers for rules: severity from estimated gain, unit conversions."""

from __future__ import annotations

from typing import Any

from proflab.model.findings import Finding, Severity

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


def gain_finding(category: str, gain_ns: float, wall_ns: int, *, id: str | None = None, **fields: Any) -> Finding:
    """A finding whose severity and gain follow from the time it would save (ns) over the
    analysed window; ``fields`` carries title, evidence, fix, where and assumption. ``id``
    defaults to the category (a family with several findings per category names each).
    No fix saves more than the window it is measured over: events that overlap where they
    cannot (a damaged or duplicated trace) could otherwise sum past it."""
    if wall_ns > 0:
        gain_ns = min(gain_ns, wall_ns)
    gain_pct = pct(gain_ns, wall_ns, 2)
    return Finding(
        id=id or category,
        category=category,
        severity=severity(gain_pct),
        est_gain_ms=gain_ns / 1e6,
        est_gain_pct=gain_pct,
        **fields,
    )
