"""Nsight Compute verdicts joined to the timeline: each profiled kernel's GPU time there.

``join_timeline(verdicts, rows)`` matches each profiled kernel to the timeline's hot-kernel
rows and gives its GPU time there (:class:`KernelTime`, which the kernel findings of
:mod:`proflab.rules.kernels` weigh); the report that carries them is
:func:`proflab.report.deepdive.deep_dive`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proflab.analysis.deepdive.verdicts import KernelVerdict, base_function_name

__all__ = ["match_kernels", "join_timeline", "KernelTime", "TimelineJoin"]


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
