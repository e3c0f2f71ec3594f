"""Shared helpers for rules: severity from estimated gain, unit conversions."""

from __future__ import annotations

import dataclasses
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


def steps_in_window(ctx) -> int:
    """The GPU-side steps the analysed window holds (0: none, the window is the unit)."""
    obs = ctx.observer
    if obs is not None and obs.steps:
        return int(obs.steps)
    return int(ctx.trace.steps.height)


def predicted(f: Finding, ctx, *fixes) -> Finding:
    """``f`` with its gain as the bare step time its fix saves: the step replayed with
    ``fixes`` (``analysis.whatif``), critical path before and after. Where no replay can be
    made (no steps, no launch links) or the finding names no fix, its idle-time gain over the
    window is divided over the window's steps, and the finding says which model gave it."""
    w = ctx.whatif
    if fixes and w.available:
        return repredicted(f, w, fixes)
    n = steps_in_window(ctx)
    why = w.why_not if not w.available else "its fix has no transformation in the what-if model"
    return dataclasses.replace(
        f, est_gain_ms=f.est_gain_ms / n if n else f.est_gain_ms,
        prediction={"model": "idle time", "per": "step" if n else "window", "no_replay": why},
    )  # fmt: skip


_REPLAYED = "predicted by replaying the bare step with the fix"
_LITTLE = "; predicted to save little: the step's critical path does not run through it"


def repredicted(f: Finding, whatif, fixes: tuple = ()) -> Finding:
    """``f`` with the gain ``whatif`` predicts for its fixes (``fixes``, else its own): a
    trace analysed in parts predicts its findings' gains again over all parts' steps."""
    fixes = tuple(fixes or f.fixes)
    p = whatif.predict(*fixes)
    title = f.title.removesuffix(_LITTLE)
    if p.gain_pct < MIN_GAIN_PCT:
        title += _LITTLE
    assumption = f.assumption if _REPLAYED in f.assumption else (f.assumption + "; " if f.assumption else "") + _REPLAYED
    prediction, sev = p.to_dict(), severity(p.severity_pct)
    # A range the rule set around its replayed fixes (the factors it cannot tell, tensor_cores_tf32's say)
    # is kept in proportion, and a severity that followed the range's lower end follows it again.
    rng = (f.prediction or {}).get("predicted_gain_range_ms")
    if rng and f.est_gain_ms > 0 and (rng[0] < f.est_gain_ms or rng[1] > f.est_gain_ms):
        k, low = p.gain_ms / f.est_gain_ms, rng[0] / f.est_gain_ms
        own = prediction.get("predicted_gain_range_ms") or [p.gain_ms, p.gain_ms]
        prediction["predicted_gain_range_ms"] = [round(min(rng[0] * k, own[0]), 3), round(max(rng[1] * k, own[1]), 3)]
        if f.severity == severity(f.est_gain_pct * low) != severity(f.est_gain_pct):
            sev = severity(p.severity_pct * low)
    return dataclasses.replace(
        f, title=title, severity=sev, est_gain_ms=p.gain_ms, est_gain_pct=p.gain_pct,
        prediction=prediction, fixes=fixes, assumption=assumption,
    )  # fmt: skip


def keep(f: Finding, ctx) -> list[Finding]:
    """``[f]`` where its predicted gain is material; in a part of a trace analysed in parts,
    any finding with a fix to replay (the combined report decides over all parts' steps)."""
    if f.est_gain_pct >= MIN_GAIN_PCT or (ctx.part_digest is not None and f.fixes):
        return [f]
    return []


def with_try(f: Finding, *knobs: str) -> Finding:
    """``f`` naming the ``proflab try`` line that makes its fix without code changes and
    measures it (``collect/knobs.py``): in its fix, and as ``evidence["proflab_try"]``."""
    line = f"proflab try {' '.join(knobs)} -- <your command>"
    return dataclasses.replace(
        f, fix=f.fix.rstrip() + f" Measure it without changing code: {line}.", evidence={**f.evidence, "proflab_try": line}
    )
