"""Scaling efficiency across runs of one program at different GPU counts.

Each point is a job (or a single trace: one GPU) analysed as usual; its step time is the
slowest rank's median step (ranks run in lockstep, the job goes at the slowest one's pace).
Against the point with the fewest GPUs (``base``, N0 GPUs, step T0):

- **weak** scaling (the same work per GPU): ideal step = T0; efficiency = T0 / TN.
- **strong** scaling (the same total work): ideal step = T0 x N0 / N; efficiency = ideal / TN.

The loss per step (TN - ideal) is split into what the traces show: exposed communication
(transfer no compute hid while compute was queued behind it, median rank: transfer that ran
while a rank's host was behind is the host's, see ``analysis.ranks``), imbalance (how much
later than the others the latest rank reached the collectives, counted once per step: every
other rank waits for it together), and the rest (compute, idle and everything else that grew;
negative where the base run lost more than the traces show here), each in ms per step.
Missing is not zero: a point without a figure leaves it null.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ScalingPoint", "point_of", "profiler_notes", "scaling_rows"]


@dataclass(frozen=True)
class ScalingPoint:
    label: str
    gpus: int
    step_ms: float | None  # the job's step: slowest rank's median step
    exposed_comm_ms: float | None  # per step, median rank
    wait_ms: float | None  # per step: the latest rank's lead, once for the job
    idle_ms: float | None  # per step, median rank (GPU idle)
    # the job's step without the profiler, where `proflab run` measured it in every rank's
    # process (or --bare-step-ms gave it): the slowest rank's
    bare_step_ms: float | None = None


def _median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def point_of(label: str, report, *, bare_step_ms: float | None = None) -> ScalingPoint:
    """A point from a JobReport (several ranks) or a Report (one GPU). ``bare_step_ms``: the
    one process's unprofiled step, where measured (a job's ranks carry their own)."""
    from proflab.report import JobReport

    if isinstance(report, JobReport):
        rows = list(report.ranks)
        steps = [r["step_ms"] for r in rows if r.get("step_ms") is not None]

        def per_step(key: str) -> float | None:
            return _median([r[key] / r["steps"] for r in rows if r.get(key) is not None and r.get("steps")])

        blocking = _median(
            [(r["exposed_transfer_ms"] - (r.get("starved_transfer_ms") or 0.0)) / r["steps"]
             for r in rows if r.get("exposed_transfer_ms") is not None and r.get("steps")]
        )  # fmt: skip
        late = [r["late_ms"] / r["steps"] for r in rows if r.get("late_ms") is not None and r.get("steps")]
        bare = [r.get("bare_step_ms") for r in rows]
        return ScalingPoint(
            label,
            report.summary.get("world_size") or len(rows),
            max(steps) if steps else None,
            blocking,
            max(late) if late else None,
            per_step("idle_ms"),
            max(bare) if bare and all(isinstance(b, (int, float)) and b > 0 for b in bare) else None,
        )
    s = report.summary
    idle = (s.get("breakdown_ms") or {}).get("idle")
    n = s.get("step_count") or 0
    obs = s.get("observer") or {}
    bare = bare_step_ms or (obs.get("bare_step_ms") if obs.get("source") == "measured" else None)
    return ScalingPoint(label, 1, s.get("median_step_ms"), 0.0, 0.0, None if idle is None or not n else idle / n, bare)


def scaling_rows(points: list[ScalingPoint], mode: str) -> list[dict[str, Any]]:
    """One row per point, fewest GPUs first: efficiency and where the loss per step goes."""
    if mode not in ("weak", "strong"):
        raise ValueError(f"mode must be weak or strong, not {mode!r}")
    pts = sorted(points, key=lambda p: p.gpus)
    base = pts[0]
    rows = []
    for p in pts:
        if p.step_ms is None or base.step_ms is None:
            rows.append({"label": p.label, "gpus": p.gpus, "step_ms": p.step_ms, "efficiency_pct": None, **_bare(p, base, mode)})
            continue
        ideal = base.step_ms if mode == "weak" else base.step_ms * base.gpus / p.gpus
        loss = p.step_ms - ideal
        comm = None if p.exposed_comm_ms is None or base.exposed_comm_ms is None else p.exposed_comm_ms - base.exposed_comm_ms
        wait = None if p.wait_ms is None or base.wait_ms is None else p.wait_ms - base.wait_ms
        other = None if comm is None or wait is None else loss - comm - wait
        rows.append(
            {
                "label": p.label,
                "gpus": p.gpus,
                "step_ms": round(p.step_ms, 3),
                "ideal_step_ms": round(ideal, 3),
                "efficiency_pct": round(100.0 * ideal / p.step_ms, 1) if p.step_ms else None,
                "loss_ms_per_step": round(loss, 3),
                "exposed_comm_ms_per_step": None if comm is None else round(comm, 3),
                "imbalance_wait_ms_per_step": None if wait is None else round(wait, 3),
                "other_ms_per_step": None if other is None else round(other, 3),
                "idle_ms_per_step": None if p.idle_ms is None else round(p.idle_ms, 3),
                **_bare(p, base, mode),
            }
        )
    return rows


def _bare(p: ScalingPoint, base: ScalingPoint, mode: str) -> dict[str, Any]:
    """The same efficiency from the unprofiled steps, where both points have them: the
    profiler slows host-bound loops more than GPU-bound ones, so the two can differ."""
    if p.bare_step_ms is None or base.bare_step_ms is None:
        return {"bare_step_ms": p.bare_step_ms, "bare_efficiency_pct": None}
    ideal = base.bare_step_ms if mode == "weak" else base.bare_step_ms * base.gpus / p.gpus
    return {"bare_step_ms": round(p.bare_step_ms, 3), "bare_efficiency_pct": round(100.0 * ideal / p.bare_step_ms, 1)}


# profiled and unprofiled efficiencies further apart than this (percentage points) get a note
_DISAGREE_PTS = 2.0


def profiler_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Where a point's efficiency from the profiled steps and from the unprofiled ones
    disagree: by how much, and the profiler's slow-down of the base run and of the point
    that explains it. The unprofiled one is the program's: the profiler's cost is a
    per-launch host cost, large on a host-bound base run and hidden on a GPU-bound one, so
    it does not cancel in the ratio."""
    if not rows:
        return []
    base = rows[0]
    notes = []
    for r in rows[1:]:
        eff, bare_eff = r.get("efficiency_pct"), r.get("bare_efficiency_pct")
        if eff is None or bare_eff is None or abs(eff - bare_eff) < _DISAGREE_PTS:
            continue
        notes.append(
            f"at {r['gpus']} GPUs the profiled steps give {eff:g}% and the unprofiled ones {bare_eff:g}%: the profiler "
            f"slowed the base run {base['step_ms'] / base['bare_step_ms']:.2f}x ({base['bare_step_ms']:g} -> "
            f"{base['step_ms']:g} ms) and this one {r['step_ms'] / r['bare_step_ms']:.2f}x ({r['bare_step_ms']:g} -> "
            f"{r['step_ms']:g} ms); {bare_eff:g}% is the program's efficiency"
        )
    return notes
