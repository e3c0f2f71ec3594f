"""Kernel-level findings from Nsight Compute verdicts.

Each kernel gets one bound-class finding (``memory_bound``, ``compute_bound`` or
``latency_bound``) and one finding per specific cause it shows (``low_occupancy``,
``warp_stalls``, ``uncoalesced_access``, ``bank_conflicts``, ``divergence``, and local memory:
register spills or per-thread arrays in local memory, a ``memory_bound`` finding with id
``local_memory_spills:KERNEL``). When local memory carries most of the kernel's L1 traffic it
explains the L1TEX stalls and the latency: its finding then takes their estimate, ranks ahead
of them, and the stall finding it explains is not repeated. The gain of a
finding is the kernel's total GPU time (from the timeline when the profile is joined to one,
else the profiled launches' duration) times an estimated speedup: ncu's own rule estimate when
ncu gives one for that cause (``global`` estimates only: a share of the whole kernel), else
the headroom stated in the finding's assumption. Causes of one kernel overlap, so their gains
are not additive; findings are ranked by gain.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proflab.analysis.deepdive.join import KernelTime
from proflab.analysis.deepdive.verdicts import HIGH_PCT, L1TEX_STALLS, KernelVerdict, is_local_rule, limiter_fix
from proflab.model.findings import Finding
from proflab.rules._common import severity

__all__ = ["kernel_findings", "KernelTime", "CAUSE_RULES"]

# ncu rule names that estimate the gain of fixing each cause
CAUSE_RULES = {
    "uncoalesced_access": ("UncoalescedGlobalAccess", "MemoryCacheAccessPattern"),
    "bank_conflicts": ("SharedMemoryConflicts", "UncoalescedSharedAccess"),
    "divergence": ("ThreadDivergence",),
    "low_occupancy": ("TheoreticalOccupancy", "AchievedOccupancy"),
    "warp_stalls": ("CPIStall",),
}
_BENIGN_STALLS = {"wait", "not_selected", "gmma", "drain", "sleeping", "misc"}
UNCOALESCED_PCT = 20.0  # excessive sectors, % of all L2 sectors requested by global accesses
BANK_CONFLICT_PCT = 20.0  # excessive shared-memory wavefronts, % of all
DIVERGENT_THREADS = 24.0  # average active threads per warp (of 32)
LOW_OCCUPANCY_PCT = 50.0  # theoretical occupancy
STALL_SHARE_PCT = 40.0  # share of stall cycles for one reason to be named as the cause
LOCAL_EXPLAINS_PCT = 50.0  # local memory's share of L1 sectors from which it explains the L1TEX stalls


def _ncu_speedup(v: KernelVerdict, category: str) -> tuple[float, str] | None:
    best = None
    for r in v.rules:
        if category == "uncoalesced_access" and is_local_rule(r):
            continue  # an access-pattern rule about local loads/stores: the local-memory finding's
        if r["rule"] in CAUSE_RULES.get(category, ()) and r.get("est_speedup_pct") is not None:
            if (r.get("speedup_type") or "global") != "global":
                continue
            if best is None or r["est_speedup_pct"] > best[0]:
                best = (float(r["est_speedup_pct"]), r["rule"])
    return best


def _ncu_material(v: KernelVerdict, category: str, min_pct: float = 5.0) -> bool:
    """ncu's own rule estimates at least ``min_pct`` % saving from fixing this cause."""
    est = _ncu_speedup(v, category)
    return est is not None and est[0] >= min_pct


def _finding(v: KernelVerdict, kt: KernelTime, denom_ns: float, category: str, frac: float,
             assumption: str, title: str, evidence: dict[str, Any], fix: str) -> Finding:
    frac = max(0.0, min(frac, 1.0))
    gain_ns = kt.total_ns * frac
    gain_pct = round(100.0 * gain_ns / denom_ns, 2) if denom_ns else 0.0
    ev = {
        "kernel_total_ms": round(kt.total_ns / 1e6, 3),
        "kernel_time_from": kt.source,
        "launches": kt.launches,
        "ncu_duration_us": None if v.duration_ns is None else round(v.duration_ns / 1e3, 2),
        **evidence,
        "est_speedup_pct": round(100.0 * frac, 1),
    }
    return Finding(
        id=f"{category}:{v.name}",
        category=category,
        severity=severity(gain_pct),
        title=title,
        evidence=ev,
        est_gain_ms=gain_ns / 1e6,
        est_gain_pct=gain_pct,
        fix=fix,
        where={"kernels": [v.name], **kt.where},
        assumption=assumption,
    )


def _short(name: str, n: int = 60) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def _estimate(v: KernelVerdict, category: str, fallback: float, fallback_why: str) -> tuple[float, str]:
    ncu = _ncu_speedup(v, category)
    if ncu is not None:
        return ncu[0] / 100.0, f"ncu's {ncu[1]} rule estimates this share of the kernel's time as the saving"
    return fallback, fallback_why


def _bound_finding(v: KernelVerdict, kt: KernelTime, denom: float) -> Finding | None:
    m = v.metrics
    sm, mem = m.get("sm_pct"), m.get("memory_pct")
    if v.bound is None or sm is None or mem is None:
        return None
    base = {"sm_throughput_pct": round(sm, 1), "memory_throughput_pct": round(mem, 1)}
    for k in ("dram_pct", "l2_pct", "l1_pct", "tensor_pipe_pct", "achieved_occupancy_pct", "theoretical_occupancy_pct"):
        if m.get(k) is not None:
            base[k.replace("_pct", "_throughput_pct") if k in ("dram_pct", "l2_pct", "l1_pct") else k] = round(m[k], 1)
    if v.roofline is not None and v.roofline.percent_of_roof is not None:
        base["percent_of_roof"] = round(v.roofline.percent_of_roof, 1)
    # Inductor's generated kernels are compiled code already: they are tuned, not compiled again
    inductor = v.name.startswith("triton_")
    if v.bound == "memory":
        frac = 1.0 - mem / 100.0
        return _finding(
            v, kt, denom, "memory_bound", frac,
            f"reaching the peak of the busiest memory unit ({v.memory_unit or 'memory'}); moving fewer bytes can save more than this",
            f"{_short(v.name)} is memory-bound: {v.memory_unit or 'memory'} at {mem:.0f}% of peak",
            base,
            ("Move fewer bytes: this is torch.compile's generated kernel; let Inductor fuse more around it (fewer graph "
             "breaks, mode='max-autotune' to search its tile sizes), store tensors in lower precision (bf16, fp8)."
             if inductor else
             "Move fewer bytes: fuse this kernel with its producer or consumer (torch.compile or a fused op), "
             "store tensors in lower precision (bf16, fp8), and reuse data from L2/shared memory instead of re-reading it."),
        )
    if v.bound == "compute":
        tensor = m.get("tensor_pipe_pct") or 0.0
        frac = 1.0 - (max(sm, tensor) / 100.0)
        fix = ("Do less arithmetic per result: lower precision, cheaper math (fast intrinsics), algebraic simplification; "
               "the kernel already keeps its pipes busy.")
        gemm_like = any(k in v.name.lower() for k in ("gemm", "sgemm", "matmul", "xmma", "conv"))
        if gemm_like and tensor < 10.0:
            fix = ("This matrix kernel runs on the FP32 SIMT pipes, not tensor cores: enable TF32 "
                   "(torch.backends.cuda.matmul.allow_tf32 = True or torch.set_float32_matmul_precision('high')) "
                   "or run it in bf16 (torch.autocast).")
        return _finding(
            v, kt, denom, "compute_bound", frac,
            "reaching the SM's (or tensor pipe's) peak throughput at the same instruction mix",
            f"{_short(v.name)} is compute-bound: SM at {sm:.0f}% of peak" + (f", tensor pipe {tensor:.0f}%" if tensor >= 1 else ""),
            base, fix,
        )
    busiest = max(sm, mem)
    frac = max(0.0, 1.0 - busiest / HIGH_PCT)
    waves = m.get("waves_per_sm")
    base["waves_per_sm"] = None if waves is None else round(waves, 2)
    if _local_explains(v):
        fix = ("Most of this kernel's L1 traffic is local memory, and the warps wait on it: take the per-thread "
               "arrays or spilled values out of local memory first (see its local-memory finding).")
    elif waves is not None and waves < 1.0:
        fix = (f"The grid ({m.get('grid_size') and int(m['grid_size'])} blocks) does not fill the GPU: give each launch more "
               "parallel work (batch small tensors, "
               + ("larger batches into the compiled code; mode='max-autotune' searches its block sizes), or capture the "
                  "compiled regions in CUDA graphs (mode='reduce-overhead')" if inductor else
                  "fuse small kernels, torch.compile), or capture them in a CUDA graph")
               + " so launch latency is paid once.")
    else:
        fix = ("Neither compute nor memory is busy: raise occupancy (see its limiter) or instruction-level "
               "parallelism (more independent work per thread), and cut the stall reason at the top of the list.")
    return _finding(
        v, kt, denom, "latency_bound", frac,
        f"bringing the busier unit to {HIGH_PCT:.0f}% of peak, the level at which a kernel counts as throughput-bound",
        f"{_short(v.name)} is latency-bound: SM {sm:.0f}%, memory {mem:.0f}% of peak",
        base, fix,
    )


def _local_explains(v: KernelVerdict) -> bool:
    """Local memory carries most of the kernel's L1 traffic and the warps wait on L1TEX (or
    the input has no stall breakdown): the spills explain the latency and the stalls."""
    if not v.local_memory_named:
        return False
    lm = v.local_memory or {}
    share = lm.get("share_of_l1_sectors_pct")
    if share is not None and share < LOCAL_EXPLAINS_PCT:
        return False
    if share is None and not _local_rule_estimate(v):
        return False
    return not v.stalls or v.stalls[0]["reason"] in L1TEX_STALLS


def _local_rule_estimate(v: KernelVerdict) -> tuple[float, str] | None:
    """The largest of ncu's global-speedup estimates for its access-pattern rules on local
    loads and stores."""
    ests = [(float(r["est_speedup_pct"]), r["rule"]) for r in (v.local_memory or {}).get("ncu_rules", ())
            if r.get("est_speedup_pct") is not None and (r.get("speedup_type") or "global") == "global"]
    return max(ests) if ests else None


def _local_memory_finding(v: KernelVerdict, kt: KernelTime, denom: float, explained: list[tuple[float, str]]) -> Finding | None:
    if not v.local_memory_named:
        return None
    lm = dict(v.local_memory or {})
    share = lm.get("share_of_l1_sectors_pct")
    l1tex_share = sum(s["share_pct"] for s in v.stalls if s["reason"] in L1TEX_STALLS) if v.stalls else None
    if share is not None and l1tex_share is not None:
        frac = share / 100.0 * l1tex_share / 100.0
        why = "local memory's share of the L1 sectors, times the share of stall cycles spent waiting on L1TEX"
    elif share is not None:
        frac = share / 100.0 * (v.metrics.get("memory_pct") or 0.0) / 100.0
        why = "local memory's share of the L1 sectors, times the memory unit's utilisation"
    elif (est := _local_rule_estimate(v)) is not None:
        frac, why = est[0] / 100.0, f"ncu's {est[1]} rule on local loads/stores estimates this share of the kernel's time"
    else:
        frac, why = 0.0, "no estimate: the input has neither local sector counts nor ncu's local access-pattern rules"
    if explained and _local_explains(v):
        top = max(explained)
        if top[0] > frac:
            frac = top[0]
            why = (f"the local-memory traffic is what the kernel waits on, so it takes the estimate of the {top[1]} "
                   "it explains")
    spills = lm.get("kind") == "register spills"
    regs, stack = lm.get("registers_per_thread"), lm.get("stack_bytes_per_thread")
    what = "register spills to local memory" if spills else (
        "per-thread arrays in local memory" if lm.get("kind") == "local arrays" else "local memory traffic")
    detail = []
    if share is not None:
        detail.append(f"{share:.0f}% of L1 sectors")
    if lm.get("local_bytes"):
        detail.append(f"{lm['local_bytes'] / 1e9:.2f} GB of L1 sectors")
    if lm.get("spill_requests"):
        detail.append(f"{lm['spill_requests']:,.0f} spill requests")
    elif lm.get("kind") == "local arrays":
        detail.append("0 register-spill requests")
    if regs is not None:
        detail.append(f"{regs:.0f} registers/thread")
    if stack:
        detail.append(f"{stack:,.0f} B stack/thread")
    arrays = ("Keep per-thread arrays out of local memory: registers cannot be indexed at run time, so index the array "
              "only with compile-time constants (fully unrolled loops) to keep it in registers, or move it to shared memory "
              "laid out so that a warp's lanes hit different banks")
    block = v.metrics.get("block_size")
    if stack and block:
        arrays += f" (the {stack:,.0f} B stack frame per thread is {stack * block / 1024:,.0f} KiB per block of {block:.0f} threads)"
    arrays += "; where it is too large for either, give each thread a smaller working set or split the kernel."
    pressure = ("Cut register pressure so nothing spills: shorten live ranges, unroll less; weigh __launch_bounds__"
                "(threads, minBlocks) or -maxrregcount (a tighter cap spills more, a looser one lowers occupancy); "
                "or split the kernel so each part needs fewer live registers.")
    fix = pressure if spills else arrays if lm.get("kind") == "local arrays" else f"{arrays} {pressure}"
    if lm.get("useful_bytes_per_load_sector") is not None and lm["useful_bytes_per_load_sector"] < 16:
        fix += (f" Each local load uses {lm['useful_bytes_per_load_sector']:.1f} of 32 bytes per sector: lanes read "
                "different elements, so every access is scattered too.")
    evidence = {**{k: v_ for k, v_ in lm.items() if k != "ncu_rules"}, "stalls": [dict(s) for s in v.stalls]}
    if lm.get("ncu_rules"):
        evidence["ncu_local_rules"] = [{k: r[k] for k in ("rule", "est_speedup_pct") if k in r} for r in lm["ncu_rules"]]
    f = _finding(v, kt, denom, "memory_bound", frac, why,
                 f"{_short(v.name)}: {what}" + (f" ({', '.join(detail)})" if detail else ""), evidence, fix)
    return replace(f, id=f"local_memory_spills:{v.name}")


def _cause_findings(v: KernelVerdict, kt: KernelTime, denom: float) -> list[Finding]:
    out: list[Finding] = []
    m = v.metrics
    u = v.uncoalesced or {}
    excess, spr = u.get("excessive_sectors_pct"), u.get("load_sectors_per_request")
    local_share = (v.local_memory or {}).get("share_of_l1_sectors_pct")
    if (excess is not None and excess >= UNCOALESCED_PCT) or (spr is not None and spr >= 8) or _ncu_material(v, "uncoalesced_access"):
        frac, why = _estimate(v, "uncoalesced_access", (excess or 0.0) / 100.0 * ((m.get("memory_pct") or 0) / 100.0),
                              "the excessive sectors' share of memory traffic, times the memory unit's utilisation")
        if local_share is not None and frac > 1.0 - local_share / 100.0:
            # global accesses are only this share of the L1 traffic; the rest is local memory
            frac = 1.0 - local_share / 100.0
            why = f"capped at global accesses' share of the L1 sectors ({100.0 - local_share:.1f}%); the rest is local memory"
        out.append(_finding(
            v, kt, denom, "uncoalesced_access", frac, why,
            f"{_short(v.name)}: uncoalesced global access" + (f" ({spr:g} sectors per load request; 4 is ideal for 4-byte loads)" if spr else ""),
            {"excessive_sectors_pct": excess, "load_sectors_per_request": spr},
            "Make neighbouring threads touch neighbouring addresses: index the fastest-varying dimension with threadIdx.x, "
            "transpose through shared memory, or switch to a structure-of-arrays layout; make the tensor contiguous "
            "(.contiguous()) before the kernel if the stride comes from a view.",
        ))
    b = v.bank_conflicts or {}
    bex = b.get("excessive_wavefronts_pct")
    if (bex is not None and bex >= BANK_CONFLICT_PCT) or _ncu_material(v, "bank_conflicts"):
        frac, why = _estimate(v, "bank_conflicts", (bex or 0.0) / 100.0 * ((m.get("l1_pct") or 0) / 100.0),
                              "the excessive wavefronts' share, times L1/shared-memory utilisation")
        wpi = b.get("wavefronts_per_shared_instruction")
        out.append(_finding(
            v, kt, denom, "bank_conflicts", frac, why,
            f"{_short(v.name)}: shared-memory bank conflicts" + (f" ({bex:g}% of shared-memory wavefronts are conflict replays)" if bex else ""),
            {"excessive_wavefronts_pct": bex, "wavefronts_per_shared_instruction": wpi},
            "Pad the shared-memory tile (e.g. float tile[32][33]) or swizzle its index so that the 32 lanes of a warp hit 32 different banks.",
        ))
    at = m.get("active_threads_per_warp")
    if (at is not None and at < DIVERGENT_THREADS) or _ncu_material(v, "divergence"):
        frac, why = _estimate(v, "divergence", (1.0 - (at or 32.0) / 32.0) * ((m.get("sm_pct") or 0) / 100.0),
                              "idle lanes' share, times SM utilisation")
        out.append(_finding(
            v, kt, denom, "divergence", frac, why,
            f"{_short(v.name)}: divergent warps" + (f" ({at:.1f} of 32 threads active per instruction)" if at is not None else ""),
            {"active_threads_per_warp": at, "branch_efficiency_pct": m.get("branch_efficiency_pct")},
            "Make branches uniform per warp: partition or sort work so that the threads of a warp take the same path, "
            "and replace short branches with arithmetic selects.",
        ))
    theo, ach, waves = m.get("theoretical_occupancy_pct"), m.get("achieved_occupancy_pct"), m.get("waves_per_sm")
    if v.bound == "latency" and theo is not None and ach is not None and (waves is None or waves >= 1.0) and (
        theo < LOW_OCCUPANCY_PCT or ach < 0.6 * theo
    ):
        frac, why = _estimate(v, "low_occupancy", max(0.0, 1.0 - max(m.get("sm_pct") or 0, m.get("memory_pct") or 0) / HIGH_PCT),
                              f"bringing the busier unit to {HIGH_PCT:.0f}% of peak")
        limited = theo < LOW_OCCUPANCY_PCT
        fix = (limiter_fix(v.occupancy_limiter) if limited else None) or (
            "Achieved occupancy is far below theoretical: balance work across blocks (tail effect), and avoid long-running outlier blocks.")
        out.append(_finding(
            v, kt, denom, "low_occupancy", frac, why,
            f"{_short(v.name)}: low occupancy, {ach:.0f}% achieved of {theo:.0f}% theoretical"
            + (f" (limited by {v.occupancy_limiter})" if limited and v.occupancy_limiter else ""),
            {"achieved_occupancy_pct": round(ach, 1), "theoretical_occupancy_pct": round(theo, 1),
             "limiter": v.occupancy_limiter, "block_limits": dict(v.block_limits),
             "registers_per_thread": m.get("registers_per_thread"), "block_size": m.get("block_size")},
            fix,
        ))
    if v.bound == "latency" and v.stalls:
        top = v.stalls[0]
        # stalls on L1TEX that local memory explains are its finding's evidence, not a second finding
        if top["reason"] not in _BENIGN_STALLS and top["share_pct"] >= STALL_SHARE_PCT and not _local_explains(v):
            frac, why = _estimate(v, "warp_stalls", max(0.0, 1.0 - max(m.get("sm_pct") or 0, m.get("memory_pct") or 0) / HIGH_PCT) * top["share_pct"] / 100.0,
                                  "the top stall's share of stall cycles, times the latency-bound headroom")
            out.append(_finding(
                v, kt, denom, "warp_stalls", frac, why,
                f"{_short(v.name)}: warps stall on {top['reason']} ({top['share_pct']:.0f}% of stall cycles)",
                {"stalls": [dict(s) for s in v.stalls], "warp_cycles_per_issue": m.get("warp_cycles_per_issue")},
                top["fix"][0].upper() + top["fix"][1:] + ".",
            ))
    return out


def kernel_findings(verdicts: list[KernelVerdict], times: dict[str, KernelTime], denom_ns: float) -> list[Finding]:
    """Findings for every verdict, largest estimated gain first. ``times`` maps a verdict's
    name to its GPU time; ``denom_ns`` is what ``est_gain_pct`` is a share of (the analysed
    window when joined to a timeline, else the profiled kernels' total time)."""
    out: list[Finding] = []
    for v in verdicts:
        kt = times.get(v.name)
        if kt is None:
            kt = KernelTime((v.duration_ns or 0.0) * v.launches, v.launches, "ncu", {})
        f = _bound_finding(v, kt, denom_ns)
        causes = _cause_findings(v, kt, denom_ns)
        # what local memory explains: the latency reading and the L1TEX stalls (ncu's CPIStall
        # estimate for them when it gives one)
        explained = []
        if f is not None and f.category == "latency_bound":
            explained.append((f.evidence["est_speedup_pct"] / 100.0, "latency_bound reading"))
        stall = _ncu_speedup(v, "warp_stalls")
        if stall is not None and v.stalls and v.stalls[0]["reason"] in L1TEX_STALLS:
            explained.append((stall[0] / 100.0, f"L1TEX stalls (ncu's {stall[1]} rule)"))
        lmf = _local_memory_finding(v, kt, denom_ns, explained)
        # listed first: the sort below is stable, so on equal gains the cause ranks ahead of
        # the reading it explains
        out.extend(x for x in (lmf, f) if x is not None)
        out.extend(causes)
    out.sort(key=lambda f: -f.est_gain_ms)
    return out
