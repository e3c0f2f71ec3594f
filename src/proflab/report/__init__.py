"""What an analysis produces: findings and the report that carries them.

These are the small objects users touch, so they are frozen dataclasses. ``Report.to_dict``
is the versioned JSON contract (``schema/report.schema.json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Finding", "Missing", "Report", "JobReport", "JOB_SCHEMA_ID", "ScalingReport", "SCALING_SCHEMA_ID", "SCHEMA_ID", "CATEGORIES", "SEVERITIES"]

SCHEMA_ID = "proflab.report/1"
SEVERITIES = ("critical", "warning", "info")
CATEGORIES = (
    # timeline
    "host_bound", "sync_bound", "launch_bound", "memcpy_bound", "pageable_memcpy",
    "tensor_cores_unused", "low_utilization", "communication_bound", "load_imbalance",
    # kernel
    "memory_bound", "compute_bound", "latency_bound", "low_occupancy", "warp_stalls",
    "uncoalesced_access", "bank_conflicts", "divergence",
    # energy
    "power_capped", "thermal_throttled",
    "healthy",
)  # fmt: skip

Severity = Literal["critical", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    """One diagnosis. ``evidence`` keys carry their unit (``idle_ms``, ``bandwidth_gbps``);
    ``est_gain_ms`` is time saved over the analysed window if fixed, under ``assumption``."""

    id: str
    category: str
    severity: Severity
    title: str
    evidence: dict[str, Any]
    est_gain_ms: float
    est_gain_pct: float
    fix: str
    where: dict[str, list[Any]] = field(default_factory=dict)
    assumption: str = ""

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"unknown finding category {self.category!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "category": self.category,
            "severity": self.severity,
            "title": self.title,
            "evidence": self.evidence,
            "est_gain_ms": round(self.est_gain_ms, 3),
            "est_gain_pct": round(self.est_gain_pct, 2),
            "fix": self.fix,
            "where": self.where,
            "assumption": self.assumption,
        }


@dataclass(frozen=True)
class Missing:
    """A signal the input lacks, and what could not be analysed because of it."""

    signal: str
    reason: str
    skipped: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"signal": self.signal, "reason": self.reason, "skipped": list(self.skipped)}


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
    """Scaling efficiency of one program across GPU counts (``analysis.scaling``): one row
    per run, fewest GPUs first, with where the loss per step goes (ms per step)."""

    mode: str  # "weak" | "strong"
    rows: tuple[dict[str, Any], ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCALING_SCHEMA_ID, "mode": self.mode, "points": list(self.rows), "notes": list(self.notes)}
