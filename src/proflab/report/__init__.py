"""What an analysis produces: findings and the report that carries them.

These are the small objects users touch, so they are frozen dataclasses. ``Report.to_dict``
is the versioned JSON contract (``schema/report.schema.json``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

# (a Finding and a Missing are the rules' and the analyses' own words: model.findings)
from proflab.model.findings import CATEGORIES, SEVERITIES, Finding, Missing, Severity

__all__ = ["Finding", "Missing", "Report", "JobReport", "JOB_SCHEMA_ID", "ScalingReport", "SCALING_SCHEMA_ID", "SCHEMA_ID", "CATEGORIES", "SEVERITIES"]

SCHEMA_ID = "proflab.report/1"


@dataclass(frozen=True)
class Report:
    """The analysis of one trace, ready for any renderer."""

    source: dict[str, Any]
    device: dict[str, Any]
    summary: dict[str, Any]
    findings: tuple[Finding, ...]
    kernels: tuple[dict[str, Any], ...]
    steps: tuple[dict[str, Any], ...] = ()
    memcpy: tuple[dict[str, Any], ...] = ()
    launch: dict[str, Any] = field(default_factory=dict)
    idle: dict[str, Any] = field(default_factory=dict)
    host_ops: tuple[dict[str, Any], ...] = ()
    ranges: tuple[dict[str, Any], ...] = ()  # user/NVTX ranges with the GPU time they launched
    missing: tuple[Missing, ...] = ()
    notes: tuple[str, ...] = ()
    verdicts: tuple[dict[str, Any], ...] = ()  # Nsight Compute's reading of each profiled kernel
    energy: dict[str, Any] | None = None  # the run directory's proflab.energy/1 document (analyze RUN_DIR)
    memory: dict[str, Any] | None = None  # GPU memory (analysis.memory), when the trace records allocations
    perf: dict[str, Any] | None = None  # where the FLOPs go (analysis.perf): operators against the roofline, MFU
    # How a notebook shows a report (``_repr_html_``): its HTML report, a renderer's work, which
    # sits above this layer; ``proflab.api`` hands the renderer in (not a field: no part of the report)
    html_view: ClassVar[Callable[[Any], str] | None] = None

    def _repr_html_(self) -> str | None:
        return None if Report.html_view is None else Report.html_view(self)

    def __repr__(self) -> str:
        inputs = ", ".join(str(i.get("path", "?")).rsplit("/", 1)[-1] for i in self.source.get("inputs", [])) or "trace"
        top = next((f for f in self.findings if f.category != "healthy"), None)
        said = f"top: {top.category} ({top.severity}, saves {top.est_gain_pct:.1f}%)" if top else "no material problem"
        return f"<Report {inputs}: {len(self.findings)} findings, {said}>"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_ID,
            "source": self.source,
            "device": self.device,
            "summary": self.summary,
            "findings": [f.to_dict() for f in self.findings],
            "kernels": list(self.kernels),
            "steps": list(self.steps),
            "memcpy": list(self.memcpy),
            "launch": self.launch,
            "idle": self.idle,
            "host_ops": list(self.host_ops),
            "ranges": list(self.ranges),
            "missing": [m.to_dict() for m in self.missing],
            "notes": list(self.notes),
            "kernel_verdicts": list(self.verdicts),
            **({"energy": self.energy} if self.energy is not None else {}),
            **({"memory": self.memory} if self.memory is not None else {}),
            **({"perf": self.perf} if self.perf is not None else {}),
        }


JOB_SCHEMA_ID = "proflab.job/1"


@dataclass(frozen=True)
class JobReport:
    """The analysis of one distributed job: each rank's own :class:`Report` plus the
    cross-rank tables (per rank, per collective) and the job's findings. Times in ms."""

    source: dict[str, Any]
    summary: dict[str, Any]
    ranks: tuple[dict[str, Any], ...]  # one row per rank: step, compute, communication, wait, overlap, idle
    collectives: tuple[dict[str, Any], ...]  # per group and collective: count, bytes, skew, bus bandwidth
    findings: tuple[Finding, ...]
    reports: tuple[Report, ...]  # the ranks' own reports, in rank order
    link: dict[str, Any] | None = None
    missing: tuple[Missing, ...] = ()
    notes: tuple[str, ...] = ()
    html_view: ClassVar[Callable[[Any], str] | None] = None  # as Report's

    def _repr_html_(self) -> str | None:
        return None if JobReport.html_view is None else JobReport.html_view(self)

    def __repr__(self) -> str:
        top = next((f for f in self.findings if f.category != "healthy"), None)
        said = f"top: {top.category} ({top.severity})" if top else "no material problem"
        return f"<JobReport {len(self.reports)} ranks: {len(self.findings)} findings, {said}>"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": JOB_SCHEMA_ID,
            "source": self.source,
            "summary": self.summary,
            "ranks": list(self.ranks),
            "collectives": list(self.collectives),
            "link": self.link,
            "findings": [f.to_dict() for f in self.findings],
            "missing": [m.to_dict() for m in self.missing],
            "notes": list(self.notes),
            "reports": [r.to_dict() for r in self.reports],
        }


SCALING_SCHEMA_ID = "proflab.scaling/1"


@dataclass(frozen=True)
class ScalingReport:
    """Scaling efficiency of one program across GPU counts (``report.scaling``): one row
    per run, fewest GPUs first, with where the loss per step goes (ms per step)."""

    mode: str  # "weak" | "strong"
    rows: tuple[dict[str, Any], ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCALING_SCHEMA_ID, "mode": self.mode, "points": list(self.rows), "notes": list(self.notes)}
