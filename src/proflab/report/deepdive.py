"""The kernel deep dive: Nsight Compute verdicts, joined to the timeline when there is one.

Each profiled kernel is matched to the timeline's kernel rows for its GPU time there
(:mod:`proflab.analysis.deepdive.join`); ``deep_dive(profile, trace=None)`` assembles the report: its
findings are the kernel-level ones (and, with a trace, the timeline's too, all ranked together
by estimated gain over the same window) and its ``kernel_verdicts`` hold ncu's reading of each
profiled kernel. Hot-kernel rows of the timeline carry the verdict of their kernel.

Reading the ncu pages is the reader's (:func:`proflab.readers.ncu.load`); the verdicts are
:mod:`proflab.analysis.deepdive.verdicts`; the findings :mod:`proflab.rules.kernels`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from proflab._version import __version__
from proflab.analysis.context import Context
from proflab.analysis.deepdive.join import join_timeline
from proflab.analysis.deepdive.verdicts import KernelVerdict, verdicts
from proflab.analysis.whatif import Fix
from proflab.model import Trace
from proflab.model.ncu import NcuProfile
from proflab.report import Missing, Report
from proflab.report.assemble import report_for
from proflab.rules._common import predicted
from proflab.rules.kernels import kernel_findings

__all__ = ["deep_dive"]


def deep_dive(profile: NcuProfile, trace: Trace | None = None, *, top_kernels: int = 15) -> Report:
    """Verdicts and kernel findings for ``profile``; with ``trace``, the whole timeline
    report with the kernel findings ranked among its own."""
    device_name = None
    if trace is not None and trace.devices.height:
        device_name = trace.devices["name"][0]
    vs = verdicts(profile, device_name)
    if trace is None:
        return _standalone(profile, vs)
    ctx = Context(trace)
    base = report_for(ctx, top_kernels=top_kernels)
    join = join_timeline(vs, ctx.hot_kernels(10_000).to_dicts())
    times, verdict_of, unmatched = join.times, join.verdict_of, join.unmatched
    window_ns = (base.summary.get("wall_ms") or 0.0) * 1e6
    # a kernel the timeline does not contain has no share of its window: keep its verdict,
    # leave its findings out, and say so
    kfind = kernel_findings([v for v in vs if v.name in times], times, window_ns)
    kfind = [_replayed(f, ctx, times) for f in kfind]
    kernels = []
    for k in base.kernels:
        k = dict(k)
        if (v := verdict_of.get(k["name"])) is not None:
            k["ncu"] = {"bound": v.bound, "headline": v.headline, "kernel": v.name}
        kernels.append(k)
    findings = sorted([*base.findings, *kfind], key=lambda f: -f.est_gain_ms)
    missing = list(base.missing)
    if unmatched:
        missing.append(Missing("timeline time of profiled kernels",
                               f"{len(unmatched)} profiled kernel(s) are not in the trace, so their findings have no gain over its window",
                               tuple(unmatched[:5])))
    return replace(
        base,
        source={**base.source, "ncu": _ncu_source(profile)},
        findings=tuple(f for f in findings if f.category != "healthy" or not kfind),
        kernels=tuple(kernels),
        verdicts=tuple(v.to_dict() for v in vs),
        missing=tuple(missing),
    )


def _replayed(f, ctx: Context, times: dict):
    """A kernel finding's gain as the bare step its fix saves: the step replayed with the
    kernel running the share of its time the finding claims faster (``analysis.whatif``)."""
    name = (f.where.get("kernels") or [None])[0]
    kt = times.get(name)
    if kt is None or not kt.total_ns or not f.est_gain_ms:
        return predicted(f, ctx)
    factor = max(1.0 - f.est_gain_ms * 1e6 / kt.total_ns, 0.0)
    return predicted(f, ctx, Fix("speed_ops", f"^{re.escape(name)}$", factor=factor, label=f"{name[:40]} {1 - factor:.0%} faster"))


def _ncu_source(profile: NcuProfile) -> dict[str, Any]:
    return {"path": profile.path, "page": profile.kind, "ncu_version": profile.ncu_version,
            "launches": profile.launches.height}


def _standalone(profile: NcuProfile, vs: list[KernelVerdict]) -> Report:
    total_ns = sum((v.duration_ns or 0.0) * v.launches for v in vs)
    findings = kernel_findings(vs, {}, total_ns)
    dev = profile.text(profile.launch_ids[0], "device__attribute_display_name") if profile.launch_ids else None
    sms = profile.value(profile.launch_ids[0], "device__attribute_multiprocessor_count", "launch__sm_count") if profile.launch_ids else None
    missing = [Missing("timeline", "an ncu result alone has no timeline: gains are shares of the profiled kernels' own time "
                       "(pass the trace too to rank them against the whole run)", ("GPU busy/idle breakdown", "timeline findings"))]
    if profile.rules.height == 0:
        missing.append(Missing("ncu rule results", "the raw page carries no rule results (add the details page CSV, or a .ncu-rep)",
                               ("ncu's estimated speedups",)))
    return Report(
        source={"inputs": [{"path": profile.path, "format": "ncu-rep" if profile.kind == "ncu-rep" else f"ncu-{profile.kind}"}], "tool": {"name": "proflab", "version": __version__},
                "ncu": _ncu_source(profile)},
        device={"name": dev, "sm_count": None if sms is None else int(sms)},
        summary={"kind": "ncu", "wall_ms": round(total_ns / 1e6, 4), "gpu_busy_pct": None, "breakdown_ms": None,
                 "step_count": 0, "median_step_ms": None, "kernels_profiled": len(vs), "launches_profiled": profile.launches.height},
        findings=tuple(findings),
        kernels=(),
        verdicts=tuple(v.to_dict() for v in vs),
        missing=tuple(missing),
        notes=profile.notes,
    )
