"""Memory rules: ``memory_leak``, ``memory_fragmentation``, ``memory_headroom``.

Pure: a :class:`proflab.analysis.memory.MemoryAnalysis` in, findings out. Memory findings save
no time by themselves (``est_gain_ms`` 0): their severity follows from the risk (how soon the
device fills, how much reserved memory is unusable) and they rank among themselves by it
(``rank_memory``). Every figure comes from the allocator's events and states its unit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from proflab.analysis.labels import allocation_label
from proflab.analysis.memory import MemoryAnalysis
from proflab.rules._common import with_try
from proflab.model.findings import Finding

__all__ = ["memory_rules", "rank_memory", "LEAK_MIN_MB_PER_STEP", "FRAG_MIN_PCT", "FRAG_MIN_MB", "OOM_WARN_PCT"]

LEAK_MIN_MB_PER_STEP = 1.0  # below this per step a trend is noise (caches, a lazily built state)
FRAG_MIN_PCT = 20.0  # reserved but unallocated, as a share of reserved at the peak
FRAG_MIN_MB = 256.0
OOM_WARN_PCT = 90.0  # peak reserved over device memory
OOM_CRIT_PCT = 97.0
_SEV = {"critical": 0, "warning": 1, "info": 2}

_ADVICE = {
    "activation": (
        "activations hold the peak: activation checkpointing (torch.utils.checkpoint) on the largest blocks, a smaller "
        "micro-batch with gradient accumulation, bf16 autocast (half the bytes per activation)"
    ),
    "optimizer_state": (
        "optimizer state holds the peak: shard it (FSDP / ZeRO), a lighter optimizer (8-bit Adam, Adafactor, SGD with "
        "momentum), and fused=True rather than foreach, which makes whole-model temporaries inside optimizer.step"
    ),
    "parameters": "parameters hold the peak: shard them (FSDP), keep a low-precision copy (bf16 weights), or offload frozen ones",
    "gradient": (
        "gradients hold the peak: free them as soon as they are used (zero_grad(set_to_none=True), optimizer-in-backward "
        "hooks), shard them (FSDP / ZeRO-2)"
    ),
    "temporary": "temporaries hold the peak: the operators listed make them; fused kernels or in-place variants avoid them",
    "retained": (
        "tensors kept across steps hold the peak: keep only numbers (loss.item()) or detached tensors, and run "
        "evaluation under torch.no_grad()"
    ),
    "persistent": "memory allocated before the window holds the peak: parameters, optimizer state, buffers and inputs",
}


def _r(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(float(x), nd)


def _top_ops(rows: list[dict[str, Any]], n: int = 3) -> list[str]:
    return [f"{allocation_label(r)}: {r['mb']:.1f} MB" for r in rows[:n]]


def _memory_finding(category: str, dev: int, severity: str, title: str, evidence: dict[str, Any], fix: str,
                    assumption: str, where: dict[str, Any] | None = None) -> Finding:
    """A memory finding: per device (its id names the GPU beyond the first), no time gain claimed."""
    return Finding(id=f"{category}_gpu{dev}" if dev else category, category=category, severity=severity, title=title,
                   evidence=evidence, est_gain_ms=0.0, est_gain_pct=0.0, fix=fix, where=where or {},
                   assumption=assumption)  # fmt: skip


def memory_rules(a: MemoryAnalysis) -> list[Finding]:
    findings: list[Finding] = []
    for d in a.devices:
        dev = d["device"]
        steps = [s for s in a.steps if s["device"] == dev]
        f = _leak(d, steps)
        if f:
            findings.append(f)
        f = _fragmentation(d)
        if f:
            findings.append(with_try(f, "expandable-segments"))
        f = _headroom(d, a, leaking=any(x.category == "memory_leak" and x.evidence["device"] == dev for x in findings))
        if f:
            findings.append(f)
    return rank_memory(findings)


def rank_memory(findings: list[Finding]) -> list[Finding]:
    order = {"memory_leak": 0, "memory_fragmentation": 1, "memory_headroom": 2}
    return sorted(findings, key=lambda f: (_SEV[f.severity], order.get(f.category, 9), f.id))


def _leak(d: dict[str, Any], steps: list[dict[str, Any]]) -> Finding | None:
    """Allocated memory left after each step grows step over step."""
    if len(steps) < 3:
        return None
    end = np.array([s["end_allocated_mb"] for s in steps], dtype=float)
    diffs = np.diff(end)
    rate = float(np.polyfit(np.arange(len(end)), end, 1)[0])
    # steady growth: no step gives back more than the noise, and at most one in four stays flat
    if rate < LEAK_MIN_MB_PER_STEP or (diffs < -LEAK_MIN_MB_PER_STEP).any() or (diffs <= 0).sum() > len(diffs) // 4:
        return None
    # the growth must be memory the steps keep: allocated in a step and never freed in the
    # window (the last step's tensors may simply not have been freed yet, so it is left out);
    # a loop whose shapes grow raises the level after each step without keeping anything
    kept_mb = [s.get("never_freed_mb") or 0.0 for s in steps[:-1]]
    if not kept_mb or float(np.mean(kept_mb)) < 0.5 * rate:
        return None
    total = d.get("device_memory_mb")
    peak = d["peak_allocated_mb"]
    until = None if not total else int((total - peak) / rate)
    sev = "warning" if until is None or until > 1000 else "critical"
    dev = d["device"]
    kept = _top_ops(d.get("retained_never_freed") or [])
    ev = {
        "device": dev,
        "growth_mb_per_step": _r(rate, 3),
        "steps": len(steps),
        "never_freed_per_step_mb": [_r(x, 3) for x in kept_mb],
        "allocated_after_each_step_mb": [_r(x, 3) for x in end],
        "peak_allocated_mb": peak,
        "device_memory_mb": total,
        "device_memory_source": d.get("device_memory_source"),
        "steps_until_device_full": until,
        "retained_never_freed": (d.get("retained_never_freed") or [])[:5],
    }
    title = (
        f"GPU {dev}: allocated memory grows {rate:.1f} MB per step ({end[0]:.0f} -> {end[-1]:.0f} MB after "
        f"{len(steps)} steps)"
        + (f"; the device is full in about {until} steps" if until is not None else "; device memory unknown: steps until full missing")
    )
    fix = (
        "Something keeps tensors alive across steps. "
        + (f"Never freed in the window, made by: {'; '.join(kept)}. " if kept else "")
        + "A tensor with autograd history kept in a list (losses.append(loss)) keeps its whole graph and saved activations: "
        "append loss.item() or loss.detach(); run evaluation under torch.no_grad(); do not keep outputs or hidden states "
        "across iterations."
    )
    return _memory_finding(
        "memory_leak", dev, sev, title, ev, fix,
        "the growth rate of the steps seen continues; steps until full = (device memory - peak allocated) / rate",
        where={"op": [r["op"] for r in (d.get("retained_never_freed") or [])[:5] if r.get("op")]},
    )


def _fragmentation(d: dict[str, Any]) -> Finding | None:
    """Reserved memory far above what is allocated at the peak: the caching allocator holds
    blocks it cannot reuse for the sizes asked."""
    res, alloc = d["reserved_at_peak_mb"], d["peak_allocated_mb"]
    unused = res - alloc
    if not res or unused < FRAG_MIN_MB or 100 * unused / res < FRAG_MIN_PCT:
        return None
    g = d.get("reserved_growth_with_free_cache") or {}
    dev = d["device"]
    ev = {
        "device": dev,
        "peak_allocated_mb": alloc,
        "reserved_at_peak_mb": res,
        "reserved_unused_at_peak_mb": _r(unused, 3),
        "reserved_unused_pct": _r(100 * unused / res),
        "reserved_growth_with_free_cache": g,
        "device_memory_mb": d.get("device_memory_mb"),
    }
    grew = (
        f"; {g['events']} times it reserved more although its cache held enough free bytes ({g['reserved_added_mb']:.0f} MB added)"
        if g.get("events")
        else ""
    )
    title = (
        f"GPU {dev}: {unused:.0f} MB reserved but unallocated at the peak ({100 * unused / res:.0f}% of {res:.0f} MB reserved)"
        + grew
    )
    fix = (
        "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place instead of new blocks per size); "
        "pad or bucket variable shapes (sequence lengths, batch sizes) to a few sizes so blocks are reused; "
        "max_split_size_mb:<N> stops large cached blocks being split for small requests; do not call "
        "torch.cuda.empty_cache() in the loop (it only returns the cache to be reserved again)."
    )
    near = d.get("peak_reserved_pct_of_device")
    sev = "warning" if near is None or near >= 50 or 100 * unused / res >= 25 else "info"
    return _memory_finding(
        "memory_fragmentation", dev, sev, title, ev, fix,
        "reserved-but-unallocated memory at the peak is what the allocator could not reuse",
    )


def _headroom(d: dict[str, Any], a: MemoryAnalysis, *, leaking: bool = False) -> Finding | None:
    """Peak against device memory: how close to OOM, or how much larger a batch would fit."""
    total = d.get("device_memory_mb")
    dev = d["device"]
    if not total:
        return None
    res = d["peak_reserved_mb"]
    pk = d["peak_allocated_mb"]
    used_pct = 100 * res / total
    cats = d.get("by_category_mb") or {}
    scal = sum(cats.get(k, 0.0) or 0.0 for k in ("activation", "temporary"))
    fixed = pk - scal
    dom = d.get("dominant_category")
    dom_txt = None if dom is None else dom.replace("_", " ")
    advice = _ADVICE.get(dom or "", "")
    tops = _top_ops(d.get("top_allocations") or [])
    ev: dict[str, Any] = {
        "device": dev,
        "peak_allocated_mb": pk,
        "peak_reserved_mb": res,
        "device_memory_mb": total,
        "device_memory_source": d.get("device_memory_source"),
        "peak_reserved_pct_of_device": _r(used_pct, 2),
        "peak_phase": d.get("peak_phase"),
        "peak_step": d.get("peak_step"),
        "dominant_category": dom,
        "by_category_mb": cats,
        "largest_at_peak": (d.get("top_allocations") or [])[:5],
    }
    factor = None
    if scal > 0:
        overhead = max(res - pk, 0.0)
        factor = (0.9 * total - overhead - fixed) / scal
        ev["batch_scaling_mb"] = _r(scal, 3)
        ev["fixed_mb"] = _r(fixed, 3)
        ev["batch_fits_x"] = _r(factor, 2)
    if leaking:
        factor = None  # the peak is not steady: no batch size fits for long
    if used_pct >= OOM_WARN_PCT:
        sev = "critical" if used_pct >= OOM_CRIT_PCT else "warning"
        title = (
            f"GPU {dev}: the peak reserves {res:.0f} of {total:.0f} MB ({used_pct:.1f}%): close to out-of-memory; "
            f"{dom_txt or 'unknown'} holds the most, the peak is in the {d.get('peak_phase')}"
        )
    else:
        sev = "info"
        title = f"GPU {dev}: peak {pk:.0f} MB allocated, {res:.0f} MB reserved of {total:.0f} MB ({used_pct:.1f}%)" + (
            f"; a batch about {factor:.1f}x larger would fit" if factor and factor > 1
            else "; it grows every step (memory_leak): no larger batch is safe" if leaking else ""
        ) + (f"; {dom_txt} holds the most, the peak is in the {d.get('peak_phase')}" if dom else "")
    fix = (advice + (". Largest at the peak: " + "; ".join(tops) if tops else "")).strip()
    return _memory_finding(
        "memory_headroom", dev, sev, title, ev, fix or "No memory pressure.",
        (
            "activations and temporaries scale with the batch, parameters, gradients, optimizer state and memory from "
            "before the window do not; 10% of device memory kept free; reserved overhead as at the peak"
        ),
        where={"op": [r["op"] for r in (d.get("top_allocations") or [])[:5] if r.get("op")]},
    )
