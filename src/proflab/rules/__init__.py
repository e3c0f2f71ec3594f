"""Diagnosis rules: ``rule(trace, ctx) -> list[Finding]``, one module per family.

Rules are pure: they read the trace and the analysis context, return findings with their
evidence and estimated gain, and record a missing signal instead of guessing.
"""

from __future__ import annotations

from proflab.analysis.context import Context
from proflab.model import Trace
from proflab.model.findings import Finding
from proflab.rules import compiled, host, inference, memcpy, tensor_cores, utilization
from proflab.rules._common import predicted

__all__ = ["RULES", "run_rules"]

RULES = (
    host.sync_bound,
    host.launch_bound,
    host.unfused_elementwise,
    host.host_bound,
    host.sync_copy_apis,
    memcpy.pageable_memcpy,
    memcpy.memcpy_bound,
    tensor_cores.tensor_cores_unused,
    tensor_cores.tensor_cores_tf32,
    tensor_cores.layout_conversions,
    utilization.low_utilization,
    compiled.graph_breaks,
    compiled.recompiles,
    compiled.cudagraph_skipped,
    inference.kv_cache_recompute,
    inference.decode_launch_bound,
    inference.per_token_sync,
    inference.decode_far_from_roof,
    inference.padding_waste,
)


def run_rules(trace: Trace, ctx: Context) -> list[Finding]:
    """All rules, ranked by estimated gain (largest first); ``healthy`` when nothing material."""
    findings = [f for rule in RULES for f in rule(trace, ctx)]
    # a gain no replay predicted is the idle time it claims, per step like the others
    findings = [f if f.prediction is not None or not f.est_gain_ms else predicted(f, ctx) for f in findings]
    findings.sort(key=lambda f: (-f.est_gain_ms, f.id))
    findings.extend(utilization.healthy(trace, ctx, findings))
    return findings
