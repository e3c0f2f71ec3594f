"""What a diagnosis says: a :class:`Finding`, and a :class:`Missing` signal when the input
lacks one. The rules return findings and the analyses record what is missing; the report
(``proflab.report``) carries both. Frozen dataclasses, no polars.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Finding", "Missing", "Severity", "CATEGORIES", "SEVERITIES", "Fix", "FIX_KINDS"]

SEVERITIES = ("critical", "warning", "info")
CATEGORIES = (
    # timeline
    "host_bound", "sync_bound", "launch_bound", "memcpy_bound", "pageable_memcpy",
    "tensor_cores_unused", "layout_conversions", "low_utilization", "communication_bound", "load_imbalance",
    # kernel
    "memory_bound", "compute_bound", "latency_bound", "low_occupancy", "warp_stalls",
    "uncoalesced_access", "bank_conflicts", "divergence",
    # energy
    "power_capped", "thermal_throttled",
    # memory
    "memory_leak", "memory_fragmentation", "memory_headroom",
    # compiled code
    "graph_breaks", "recompiles", "cudagraph_skipped",
    # inference (timeline categories apply per phase, in ``where``)
    "kv_cache_recompute", "padding_waste",
    "healthy",
)  # fmt: skip

Severity = Literal["critical", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    """One diagnosis. ``evidence`` keys carry their unit (``idle_ms``, ``bandwidth_gbps``).

    ``est_gain_ms`` is the bare step time its fix is predicted to save (ms per step; over
    the analysed window where the trace has no steps), ``est_gain_pct`` that as a share of
    the bare step where the step was replayed, of the profiled window where the gain is the
    idle time the finding claims, under ``assumption``. ``prediction`` says how it was predicted (the step
    replayed with the fix, or the idle time it claims where no replay could be made);
    ``overlaps`` names the findings whose fixes save partly the same time. ``fixes`` are the
    what-if transformations the prediction made (not serialised)."""

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
    prediction: dict[str, Any] | None = None
    overlaps: tuple[str, ...] = ()
    fixes: tuple = field(default=(), compare=False, repr=False)

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
            **({"prediction": self.prediction} if self.prediction is not None else {}),
            **({"overlaps": list(self.overlaps)} if self.overlaps else {}),
        }


@dataclass(frozen=True)
class Missing:
    """A signal the input lacks, and what could not be analysed because of it."""

    signal: str
    reason: str
    skipped: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"signal": self.signal, "reason": self.reason, "skipped": list(self.skipped)}


# What-if fixes a finding names (``analysis.whatif.fixes`` applies them): plain values, so a
# report carries them (and the report cache keeps them) without the analysis loaded.
FIX_KINDS = ("remove_syncs", "remove_host_work", "fuse_optimizer", "compile", "cuda_graph", "speed_ops", "pin_copies",
             "prefetch_copies", "allocator", "compress_comm", "add_casts")  # fmt: skip


@dataclass(frozen=True)
class Fix:
    """One change to replay. ``target`` selects what it acts on (by kind: sync call names
    joined by "|", ``loader``/``quiet``/``all``, a kernel-name pattern); ``factor`` scales
    durations (``speed_ops``); ``rate_gbps`` is the pinned copy rate (``pin_copies``)."""

    kind: str
    target: str = ""
    factor: float = 1.0
    rate_gbps: float = 0.0
    label: str = ""

    def __post_init__(self) -> None:
        if self.kind not in FIX_KINDS:
            raise ValueError(f"unknown fix {self.kind!r}")

    @property
    def assumption(self) -> str:
        return {
            "remove_syncs": "the synchronising calls stop waiting; the host's work after them then overlaps the GPU's",
            "remove_host_work": "the host work that launches nothing leaves the training loop (workers, another process)",
            "fuse_optimizer": "the optimizer updates all parameters with a few multi-tensor kernels",
            "compile": "elementwise chains fuse into one kernel each, launched from generated code",
            "cuda_graph": ("the launches of each step's forward and backward replay from CUDA graphs (what "
                           "mode='reduce-overhead' captures), the rest stay; at the range's high end, the whole step's"
                           if self.target == "forward_backward" else "the step's launches replay from one CUDA graph"),
            "speed_ops": f"the selected kernels take {self.factor:.2f}x their time",
            "pin_copies": f"pageable copies run at {self.rate_gbps:.0f} GB/s and no longer hold the host",
            "prefetch_copies": "host-to-device copies run a step ahead on a stream of their own",
            "allocator": "no cudaFree or slow cudaMalloc inside the loop",
            "compress_comm": f"collectives carry {self.factor:g}x their bytes, and cast them both ways at {self.rate_gbps:.0f} GB/s",
            "add_casts": (f"{self.factor:.2f} casts a selected kernel are dispatched before its launch, each at the host "
                          "cost of the step's median launch"),
        }[self.kind]
