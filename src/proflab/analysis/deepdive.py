"""The kernel deep dive: Nsight Compute verdicts, joined to the timeline when there is one.

``join_timeline(verdicts, rows)`` matches each profiled kernel to the timeline's kernel rows
and gives its GPU time there; ``deep_dive(profile, trace=None)`` assembles the report: its
findings are the kernel-level ones (and, with a trace, the timeline's too, all ranked together
by estimated gain over the same window) and its ``kernel_verdicts`` hold ncu's reading of each
profiled kernel. Hot-kernel rows of the timeline carry the verdict of their kernel.

Reading the ncu pages is the reader's (:func:`proflab.readers.ncu.load`); the verdicts are
:mod:`proflab.analysis.verdicts`; the findings :mod:`proflab.rules.kernels`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from proflab import __version__
from proflab.analysis.verdicts import KernelVerdict, base_function_name, verdicts
from proflab.model import Trace
from proflab.model.ncu import NcuProfile
from proflab.report import Missing, Report

__all__ = ["deep_dive", "match_kernels", "join_timeline", "KernelTime", "TimelineJoin"]


@dataclass(frozen=True)
class KernelTime:
    """How much GPU time a kernel takes in the program: ``total_ns`` over ``launches``,
    ``source`` says where the figure comes from (``timeline`` or ``ncu``)."""

    total_ns: float
    launches: int
    source: str
    where: dict[str, list[Any]]


@dataclass(frozen=True)
class TimelineJoin:
    """Profiled kernels matched to the timeline: ``times`` by verdict name, ``verdict_of`` by
    timeline kernel name (the verdict its time was counted to), and the verdicts the
    timeline does not contain."""

    times: dict[str, KernelTime]
    verdict_of: dict[str, KernelVerdict]
    unmatched: tuple[str, ...]


def _grid(text: str | None) -> str | None:
    """ncu's "(256, 1, 1)" as the timeline's "256x1x1"."""
    if not text:
        return None
    return "x".join(p.strip() for p in text.strip("()[] ").split(","))


def match_kernels(v: KernelVerdict, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Timeline kernel rows that are the kernel ``v`` profiled: the same demangled name; else
    the same function name (ncu's default name base), narrowed by grid and block when that
    leaves several."""
    exact = [r for r in rows if r["name"] == v.name]
    if exact:
        return exact
    base = base_function_name(v.name)
    cands = [r for r in rows if base_function_name(r["name"]) == base]
    if len(cands) > 1:
        shaped = [r for r in cands if r.get("grid") == _grid(v.grid) and r.get("block") == _grid(v.block)]
        if shaped:
            cands = shaped
    return cands


def join_timeline(vs: list[KernelVerdict], rows: list[dict[str, Any]]) -> TimelineJoin:
    """Each verdict's GPU time in the timeline's hot-kernel ``rows`` (one matching pass: a
    timeline kernel's time is counted to the first verdict that matches it)."""
    times: dict[str, KernelTime] = {}
    verdict_of: dict[str, KernelVerdict] = {}  # timeline kernel name -> the verdict its time went to
    unmatched = []
    for v in vs:
        m = match_kernels(v, rows)
        if not m:
            unmatched.append(v.name)
            continue
        for r in m:
            verdict_of.setdefault(r["name"], v)
        sources = sorted({r["source"] for r in m if r.get("source")})
        ops = sorted({r["op"] for r in m if r.get("op")})
        where: dict[str, list[Any]] = {}
        if ops:
            where["ops"] = ops
        if sources:
            where["source"] = sources
        times[v.name] = KernelTime(float(sum(r["total_ns"] for r in m)), int(sum(r["count"] for r in m)), "timeline", where)
    return TimelineJoin(times, verdict_of, tuple(unmatched))


def deep_dive(profile: NcuProfile, trace: Trace | None = None, *, top_kernels: int = 15) -> Report:
    """Verdicts and kernel findings for ``profile``; with ``trace``, the whole timeline
    report with the kernel findings ranked among its own."""
    # the rules sit above the analysis layer (and import KernelTime from here): at call time
    from proflab.rules.kernels import kernel_findings

    device_name = None
    if trace is not None and trace.devices.height:
        device_name = trace.devices["name"][0]
    vs = verdicts(profile, device_name)
    if trace is None:
        return _standalone(profile, vs)
    from proflab.analysis.context import Context
    # the timeline report is the top-level assembly's (report.assemble.report_for); imported here, at
    # call time, since the api imports the analysis layer
    from proflab.report.assemble import report_for

    ctx = Context(trace)
    base = report_for(ctx, top_kernels=top_kernels)
    join = join_timeline(vs, ctx.hot_kernels(10_000).to_dicts())
    times, verdict_of, unmatched = join.times, join.verdict_of, join.unmatched
    window_ns = (base.summary.get("wall_ms") or 0.0) * 1e6
    # a kernel the timeline does not contain has no share of its window: keep its verdict,
    # leave its findings out, and say so
    kfind = kernel_findings([v for v in vs if v.name in times], times, window_ns)
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


def _ncu_source(profile: NcuProfile) -> dict[str, Any]:
    return {"path": profile.path, "page": profile.kind, "ncu_version": profile.ncu_version,
            "launches": profile.launches.height}


def _standalone(profile: NcuProfile, vs: list[KernelVerdict]) -> Report:
    from proflab.rules.kernels import kernel_findings

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
