"""Per-kernel verdicts from Nsight Compute metrics: why is this kernel slow?

The reading follows the seeds' interpretation tables:

- bound class from speed of light: compute (SM) vs memory throughput as % of peak. Either at
  or above 60 % means that unit bounds the kernel; both below means neither is busy, so the
  kernel is latency-bound (too few warps, or warps stalled).
- occupancy: achieved vs theoretical, and which resource (registers, shared memory, warps per
  block, blocks per SM) sets the theoretical limit.
- warp stalls: the reasons warps were not issuing, in cycles per issued instruction, with the
  fix for each.
- memory hierarchy: DRAM / L2 / L1 throughput and hit rates; uncoalesced global access
  (sectors beyond the ideal); shared-memory bank conflicts (wavefronts beyond the ideal).
- tensor-pipe utilisation; divergence (active threads per warp, branch efficiency). A details
  page carries no pipe metric: there the tensor pipe's share comes from ncu's
  HighPipeUtilization rule text, and without it a kernel whose SM and L1 are both busy is not
  called memory-bound (a tensor-core GEMM reads exactly so).
- local memory: register spills and per-thread arrays the compiler placed in local memory,
  as local loads/stores and their share of L1 sectors.
- ncu's own rule results with their estimated speedups.

Metric names changed between ncu versions; each quantity lists the names it accepts, newest
first. A quantity the report lacks is None and named in ``missing``, never guessed.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from proflab.analysis.deepdive.roofline import Roofline, roofline
from proflab.model.ncu import NcuProfile

__all__ = ["KernelVerdict", "verdicts", "STALL_FIXES", "METRICS", "base_function_name", "HIGH_PCT", "LOCAL_SHARE_PCT",
           "L1TEX_STALLS", "is_local_rule"]

# A unit at or above this share of its peak bounds the kernel (the seeds' 60 % line, which is
# also where ncu's own speed-of-light rule starts to call a kernel throughput-bound).
HIGH_PCT = 60.0
# Local memory (spills, local arrays) at or above this share of the L1 sectors that local and
# global accesses request is named in the verdict.
LOCAL_SHARE_PCT = 20.0
# Stall reasons that wait on L1TEX: where local-memory loads and stores are waited for.
L1TEX_STALLS = ("long_scoreboard", "lg_throttle")
SECTOR_BYTES = 32  # an L1/L2 sector

METRICS: dict[str, tuple[str, ...]] = {
    "duration_ns": ("gpu__time_duration.sum", "gpu__time_duration.avg"),
    "sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "memory_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
    "dram_pct": (
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__cycles_active.avg.pct_of_peak_sustained_elapsed",
    ),
    "l1_pct": ("l1tex__throughput.avg.pct_of_peak_sustained_active",),
    "l2_pct": ("lts__throughput.avg.pct_of_peak_sustained_elapsed",),
    "l1_hit_pct": ("l1tex__t_sector_hit_rate.pct",),
    "l2_hit_pct": ("lts__t_sector_hit_rate.pct",),
    "achieved_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "theoretical_occupancy_pct": ("sm__maximum_warps_per_active_cycle_pct",),
    "registers_per_thread": ("launch__registers_per_thread",),
    "block_size": ("launch__block_size",),
    "grid_size": ("launch__grid_size",),
    "waves_per_sm": ("launch__waves_per_multiprocessor",),
    "tensor_pipe_pct": (
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active",
    ),
    "active_threads_per_warp": ("smsp__thread_inst_executed_per_inst_executed.ratio",),
    "branch_efficiency_pct": ("smsp__sass_average_branch_targets_threads_uniform.pct",),
    "warp_cycles_per_issue": ("smsp__average_warp_latency_per_inst_issued.ratio",),
}
_LIMITS = {
    "registers": ("launch__occupancy_limit_registers",),
    "shared memory": ("launch__occupancy_limit_shared_mem",),
    "warps": ("launch__occupancy_limit_warps",),
    "blocks per SM": ("launch__occupancy_limit_blocks",),
    "barriers": ("launch__occupancy_limit_barriers",),
}
_LIMIT_FIXES = {
    "registers": "cut registers per thread: __launch_bounds__ or -maxrregcount, fewer live values, or smaller unrolling",
    "shared memory": "use less shared memory per block (smaller tiles, fewer pipeline stages) or raise the carve-out",
    "warps": "the block size itself caps the resident warps: use blocks whose size divides the SM's warp slots",
    "blocks per SM": "blocks are too small to fill the SM before the per-SM block limit: use larger blocks",
    "barriers": "fewer named barriers per block",
}

# Stall reasons (ncu's names) with the seed's fix for each; reasons not in the seed's table
# carry the Nsight Compute profiling guide's advice.
STALL_FIXES: dict[str, str] = {
    "long_scoreboard": "waiting for L1TEX/global memory loads: increase cache hits, prefetch, improve locality",
    "short_scoreboard": "waiting for MIO (shared memory, special math): reduce bank conflicts, optimize the shared-memory layout",
    "math_pipe_throttle": "a compute pipe is oversubscribed: spread work across pipes (increase warps, reduce math intensity on that pipe)",
    "lg_throttle": "too many global/local memory instructions (memory throttle): combine into wider (vectorised) accesses, issue them less often",
    "mio_throttle": "the MIO queue is full (memory throttle): combine shared-memory operations, issue them less often",
    "tex_throttle": "texture/L1 pipe saturated (memory throttle): fewer texture fetches, combine accesses",
    "barrier": "waiting at __syncthreads(): expected with warp specialization; otherwise balance work between barriers",
    "membar": "waiting on memory barriers/fences: fewer or narrower-scope fences",
    "not_selected": "eligible but not scheduled: the schedulers are busy; this is fine unless occupancy is low",
    "wait": "fixed-latency dependencies: normal, no action needed",
    "dispatch_stall": "the dispatcher could not issue: usually pipeline contention; check the math pipes",
    "branch_resolving": "waiting for branch targets: fewer divergent branches",
    "no_instruction": "instruction cache misses: smaller kernels (less unrolling), or more warps to hide it",
    "imc_miss": "constant-cache misses: keep constants few and uniform across the warp",
    "drain": "waiting for memory stores to drain at exit: normal at the end of short kernels",
    "sleeping": "warps sleeping (nanosleep/backoff): fine unless spinning on a lock",
    "gmma": "waiting on warpgroup MMA (Hopper tensor cores): the tensor pipe is the bottleneck, as intended for GEMMs",
    "misc": "miscellaneous hardware reasons",
}
_NOT_STALLS = {"selected"}  # issuing, not stalled


def base_function_name(name: str) -> str:
    """``void ns::kern<T, 4>(float*, int)`` -> ``kern``: the name ncu's default
    ``--kernel-name-base function`` matches."""
    s = name.strip()
    # drop the parameter list: the last top-level "(...)"
    depth, cut = 0, len(s)
    for i in range(len(s) - 1, -1, -1):
        c = s[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                cut = i
                break
    s = s[:cut] if cut < len(s) and s.endswith(")") else s
    # drop template arguments
    out, depth = [], 0
    for c in s:
        if c == "<":
            depth += 1
        elif c == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(c)
    s = "".join(out).strip()
    s = s.split()[-1] if s.split() else s  # return type
    return s.split("::")[-1]


@dataclass(frozen=True)
class KernelVerdict:
    """What ncu says about one kernel (the median over its profiled launches). Percentages
    are of the unit's peak; times in ns."""

    name: str
    launches: int
    duration_ns: float | None
    bound: str | None  # memory | compute | latency
    metrics: dict[str, float | None]
    occupancy_limiter: str | None
    block_limits: dict[str, float]
    stalls: tuple[dict[str, Any], ...]  # reason, cycles_per_issue, share_pct, fix
    uncoalesced: dict[str, Any] | None
    bank_conflicts: dict[str, Any] | None
    divergence: dict[str, Any] | None
    rules: tuple[dict[str, Any], ...]
    roofline: Roofline | None
    grid: str | None = None
    block: str | None = None
    memory_unit: str | None = None  # the busiest memory level: DRAM, L2 or L1/shared
    missing: tuple[str, ...] = field(default=())
    local_memory: dict[str, Any] | None = None  # local loads/stores, spills (see _local_memory)
    top_pipe: dict[str, Any] | None = None  # ncu's HighPipeUtilization reading (details page)
    bound_note: str | None = None  # why ``bound`` is None when the throughputs alone are known
    metric_sources: dict[str, str] = field(default_factory=dict)  # metrics not read from a metric

    @property
    def local_memory_named(self) -> bool:
        """Local memory is a material part of this kernel's memory traffic."""
        lm = self.local_memory or {}
        share, over = lm.get("share_of_l1_sectors_pct"), lm.get("spill_request_overhead_pct")
        return bool((share is not None and share >= LOCAL_SHARE_PCT) or (over is not None and over >= LOCAL_SHARE_PCT)
                    or (share is None and lm.get("ncu_rules")))

    @property
    def headline(self) -> str:
        m = self.metrics
        parts = [f"{self.bound}-bound" if self.bound else "bound class unknown"]
        if self.bound is None and self.bound_note:
            parts[0] += f" ({self.bound_note})"
        if self.bound == "memory" and self.memory_unit:
            parts[0] += f" ({self.memory_unit})"
        elif self.bound == "compute" and (m.get("tensor_pipe_pct") or 0) >= HIGH_PCT:
            parts[0] += " (tensor cores)"
        if m.get("sm_pct") is not None and m.get("memory_pct") is not None:
            parts.append(f"SM {m['sm_pct']:.0f}%, memory {m['memory_pct']:.0f}% of peak")
        if m.get("achieved_occupancy_pct") is not None:
            occ = f"occupancy {m['achieved_occupancy_pct']:.0f}%"
            if m.get("theoretical_occupancy_pct") is not None:
                occ += f" of {m['theoretical_occupancy_pct']:.0f}% theoretical"
            if self.occupancy_limiter and (m.get("theoretical_occupancy_pct") or 100) < 100:
                occ += f" (limited by {self.occupancy_limiter})"
            parts.append(occ)
        if self.local_memory_named:
            lm = self.local_memory or {}
            what = "register spills" if lm.get("kind") == "register spills" else "local memory"
            if lm.get("share_of_l1_sectors_pct") is not None:
                what += f" {lm['share_of_l1_sectors_pct']:.0f}% of L1 sectors"
            parts.append(what)
        if self.stalls:
            parts.append(f"top stall {self.stalls[0]['reason']}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "launches_profiled": self.launches,
            "duration_us": None if self.duration_ns is None else round(self.duration_ns / 1e3, 3),
            "bound": self.bound,
            "memory_unit": self.memory_unit,
            "headline": self.headline,
            "grid": self.grid,
            "block": self.block,
            "metrics": {k: (None if v is None else round(v, 3)) for k, v in self.metrics.items()},
            "occupancy_limiter": self.occupancy_limiter,
            "block_limits": dict(self.block_limits),
            "stalls": [dict(s) for s in self.stalls],
            "uncoalesced": self.uncoalesced,
            "bank_conflicts": self.bank_conflicts,
            "divergence": self.divergence,
            "ncu_rules": [dict(r) for r in self.rules],
            "roofline": None if self.roofline is None else self.roofline.to_dict(),
            "local_memory": None if self.local_memory is None else dict(self.local_memory),
            "top_pipe": None if self.top_pipe is None else dict(self.top_pipe),
            "bound_note": self.bound_note,
            "metric_sources": dict(self.metric_sources),
            "missing": list(self.missing),
        }


def _median(xs: list[float | None]) -> float | None:
    ys = [x for x in xs if x is not None]
    return statistics.median(ys) if ys else None


def _med(prof: NcuProfile, lids: list[int], *names: str) -> float | None:
    """The median over ``lids`` of the first of ``names`` each launch has."""
    return _median([prof.value(lid, *names) for lid in lids])


# Stall metrics per reason, in the order to try them: cycles per issued instruction
# (WarpStateStats), else PC-sampling counts (SourceCounters without WarpStateStats).
_STALL_METRICS = (
    (re.compile(r"^smsp__(?:average_)?warps_issue_stalled_([a-z_]+)_per_issue_active\.ratio$"), "cycles_per_issue"),
    (re.compile(r"^smsp__pcsamp_warps_issue_stalled_([a-z_]+)$"), "samples"),
)


def _stalls(prof: NcuProfile, lids: list[int]) -> tuple[dict[str, Any], ...]:
    names = prof.metric_names(lids[0])
    reasons: dict[str, float] = {}
    for pattern, unit in _STALL_METRICS:
        for n in names:
            m = pattern.match(n)
            if m and m.group(1) not in _NOT_STALLS and not m.group(1).endswith("_not_issued"):
                val = _med(prof, lids, n)
                if val is not None:
                    # both the average_ and the plain per-issue name may be present
                    reasons[m.group(1)] = max(reasons.get(m.group(1), 0.0), val)
        if reasons:
            break
    total = sum(reasons.values())
    if total <= 0:
        return ()
    top = sorted(reasons.items(), key=lambda kv: -kv[1])[:4]
    return tuple(
        {
            "reason": r,
            unit: round(v, 3),
            "share_pct": round(100.0 * v / total, 1),
            "fix": STALL_FIXES.get(r.removesuffix("s") if r == "no_instructions" else r, "see the Nsight Compute profiling guide"),
        }
        for r, v in top
        if v > 0
    )


def _ratio(num: float | None, den: float | None, scale: float = 1.0, nd: int = 2) -> float | None:
    return None if num is None or not den else round(scale * num / den, nd)


def _known(**values: float | None) -> dict[str, Any] | None:
    out = {k: v for k, v in values.items() if v is not None}
    return out or None


def _uncoalesced(prof: NcuProfile, lids: list[int]) -> dict[str, Any] | None:
    med = partial(_med, prof, lids)
    return _known(
        excessive_sectors_pct=_ratio(med("derived__memory_l2_theoretical_sectors_global_excessive"),
                                     med("memory_l2_theoretical_sectors_global"), 100.0, 1),
        load_sectors_per_request=_ratio(med("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"),
                                        med("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum")),
    )


def _bank_conflicts(prof: NcuProfile, lids: list[int]) -> dict[str, Any] | None:
    med = partial(_med, prof, lids)
    wavefronts = med("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum")
    excess = med("derived__memory_l1_wavefronts_shared_excessive")
    if excess is None:  # without ncu's derived metric, each bank conflict is one extra wavefront
        conflicts = med("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum")
        excess = None if conflicts is None or wavefronts is None else min(conflicts, wavefronts)
    return _known(
        excessive_wavefronts_pct=_ratio(excess, wavefronts, 100.0, 1),
        wavefronts_per_shared_instruction=_ratio(wavefronts, med("smsp__sass_inst_executed_op_shared.sum")),
    )


def _divergence(metrics: dict[str, float | None]) -> dict[str, Any] | None:
    at, be = metrics.get("active_threads_per_warp"), metrics.get("branch_efficiency_pct")
    if at is None and be is None:
        return None
    return {"active_threads_per_warp": at, "branch_efficiency_pct": be}


def _bound(m: dict[str, float | None], top_pipe: dict[str, Any] | None, memory_unit: str | None) -> tuple[str | None, str | None]:
    """``(bound class, why it is unknown)``."""
    sm, mem, tensor = m.get("sm_pct"), m.get("memory_pct"), m.get("tensor_pipe_pct")
    if sm is None or mem is None:
        return None, None
    if tensor is not None and tensor >= HIGH_PCT:
        # a GEMM keeping the tensor pipe busy also moves its tiles through shared memory at
        # a high rate; the tensor pipe is what bounds it
        return "compute", None
    if max(sm, mem) < HIGH_PCT:
        return "latency", None
    if tensor is None and top_pipe is None and min(sm, mem) >= HIGH_PCT and mem >= sm and memory_unit == "L1/shared":
        # busy SM and busy L1/shared with no word on the pipes (a details page without the
        # ComputeWorkloadAnalysis rules): that is what a tensor-core GEMM looks like, whose
        # tiles stream through shared memory. Calling it memory-bound would send its owner
        # after the wrong fix.
        return None, (f"L1/shared at {m.get('l1_pct') or mem:.0f}% and SM at {sm:.0f}% of peak, tensor pipe utilisation "
                      "unknown: this input has no pipe metrics (add the raw page, or the ComputeWorkloadAnalysis section)")
    return ("memory" if mem >= sm else "compute"), None


# ncu's ComputeWorkloadAnalysis rule names the busiest pipe, in % of elapsed cycles:
# "Tensor is the highest-utilized pipeline (93.2%) based on elapsed cycles ...", or says
# "All compute pipelines are under-utilized."
_TOP_PIPE = re.compile(r"^\s*(?P<pipe>[A-Za-z0-9/()+ .-]+?) is the highest-utilized pipeline \((?P<pct>[\d.]+)%\)")


def _top_pipe(rules: tuple[dict[str, Any], ...]) -> dict[str, Any] | None:
    for r in rules:
        if r["rule"] != "HighPipeUtilization":
            continue
        text = r.get("description") or ""
        m = _TOP_PIPE.match(text)
        if m:
            return {"pipe": m.group("pipe"), "pct_of_elapsed": float(m.group("pct")), "from": "ncu HighPipeUtilization rule"}
        if text.startswith("All compute pipelines are under-utilized"):
            return {"pipe": None, "under_utilized": True, "from": "ncu HighPipeUtilization rule"}
    return None


def is_local_rule(rule: dict[str, Any]) -> bool:
    """An ncu access-pattern rule about local (not global) loads or stores."""
    d = rule.get("description") or ""
    return rule.get("rule") == "MemoryCacheAccessPattern" and ("local loads" in d or "local stores" in d)


_LOCAL_METRICS = {
    "load_sectors": ("l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum",),
    "store_sectors": ("l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum",),
    "load_instructions": ("smsp__sass_inst_executed_op_local_ld.sum", "sass__inst_executed_local_loads"),
    "store_instructions": ("smsp__sass_inst_executed_op_local_st.sum", "sass__inst_executed_local_stores"),
    "useful_bytes_per_load_sector": ("smsp__sass_average_data_bytes_per_sector_mem_local_op_ld.ratio",),
    "spill_requests": ("derived__local_spilling_requests",),
    "spill_request_overhead_pct": ("derived__local_spilling_requests_pct",),
    "register_spill_instructions": ("sass__inst_executed_register_spilling",),
    "stack_bytes_per_thread": ("launch__stack_size",),
}
_GLOBAL_SECTORS = tuple(f"l1tex__t_sectors_pipe_lsu_mem_global_op_{op}.sum" for op in ("ld", "st", "atom", "red"))


def _local_memory(prof: NcuProfile, lids: list[int], rules: tuple[dict[str, Any], ...],
                  registers: float | None) -> tuple[dict[str, Any] | None, bool]:
    """Local-memory traffic of a kernel, and whether the input carries any signal of it.

    Local memory holds what does not fit in registers: spilled registers, and per-thread
    arrays indexed at run time (the compiler cannot name a register by a run-time index).
    Its loads and stores go through L1 like global ones; its share of the L1 sectors that
    local and global accesses request says how much of the memory traffic it is. ncu's
    "Local Memory Spilling Requests" counts spills only, so a local array shows as local
    loads/stores with zero spill requests."""
    med = partial(_med, prof, lids)
    raw = {k: med(*names) for k, names in _LOCAL_METRICS.items()}
    local_rules = [{"rule": r["rule"], "est_speedup_pct": r.get("est_speedup_pct"), "speedup_type": r.get("speedup_type"),
                    "description": r.get("description")} for r in rules if is_local_rule(r)]
    if all(v is None for v in raw.values()) and not local_rules:
        return None, False
    ld, st = raw["load_sectors"], raw["store_sectors"]
    glob = [med(n) for n in _GLOBAL_SECTORS]
    local_sectors = None if ld is None and st is None else (ld or 0.0) + (st or 0.0)
    global_sectors = None if all(g is None for g in glob) else sum(g or 0.0 for g in glob)
    share = None
    if local_sectors is not None and global_sectors is not None and local_sectors + global_sectors > 0:
        share = round(100.0 * local_sectors / (local_sectors + global_sectors), 2)
    spills = (raw["spill_requests"] or 0) > 0 or (raw["register_spill_instructions"] or 0) > 0
    traffic = (local_sectors or 0) > 0 or bool(local_rules)
    if not spills and not traffic:
        return None, True
    counted = raw["spill_requests"] is not None or raw["register_spill_instructions"] is not None
    out: dict[str, Any] = {
        # spills when ncu counts spill requests or spill instructions; with its spill counters
        # at zero, local arrays (or a stack frame) that the compiler placed in local memory
        "kind": "register spills" if spills else "local arrays" if counted else "local memory",
        "share_of_l1_sectors_pct": share,
        "local_bytes": None if local_sectors is None else int(local_sectors * SECTOR_BYTES),
        "local_load_sectors": ld, "local_store_sectors": st, "global_sectors": global_sectors,
        "local_instructions": None if raw["load_instructions"] is None and raw["store_instructions"] is None
        else (raw["load_instructions"] or 0.0) + (raw["store_instructions"] or 0.0),
        "useful_bytes_per_load_sector": raw["useful_bytes_per_load_sector"],
        "spill_requests": raw["spill_requests"],
        "spill_request_overhead_pct": raw["spill_request_overhead_pct"],
        "register_spill_instructions": raw["register_spill_instructions"],
        "stack_bytes_per_thread": raw["stack_bytes_per_thread"],
        "registers_per_thread": registers,
        "ncu_rules": local_rules,
    }
    # share_of_l1_sectors_pct stays, None when unknown; other unknowns are left out
    return {k: v for k, v in out.items() if k == "share_of_l1_sectors_pct" or (v is not None and v != [])}, True


def _memory_unit(m: dict[str, float | None]) -> str | None:
    units = {"DRAM": m.get("dram_pct"), "L2": m.get("l2_pct"), "L1/shared": m.get("l1_pct")}
    known = {k: v for k, v in units.items() if v is not None}
    return max(known, key=lambda k: known[k]) if known else None


def verdicts(prof: NcuProfile, device_name: str | None = None) -> list[KernelVerdict]:
    """One verdict per kernel name, in the order ncu profiled them."""
    groups: dict[str, list[int]] = {}
    for lid, name in prof.launches.select("launch_id", "name").iter_rows():
        groups.setdefault(name, []).append(lid)
    out = []
    for name, lids in groups.items():
        metrics = {k: _med(prof, lids, *names) for k, names in METRICS.items()}
        # A share of a whole cannot pass 100 %, yet ncu's counters can (an L2 hit rate of
        # 102 % on a real H100 kernel in tests/data/ncu): a report states at most 100.
        metrics = {k: min(max(v, 0.0), 100.0) if k.endswith("_pct") and v is not None else v for k, v in metrics.items()}
        missing = [k for k, v in metrics.items() if v is None]
        limits = {k: v for k, names in _LIMITS.items() if (v := _med(prof, lids, *names)) is not None}
        # the resource allowing the fewest blocks per SM; ties are all named
        low = min(limits.values()) if limits else None
        limiter = " / ".join(k for k, v in limits.items() if v == low) if limits else None
        rules = tuple(
            {k: r[k] for k in ("section", "rule", "type", "est_speedup_pct", "speedup_type", "description")}
            for r in prof.rules_for(lids[0])
        )
        sources: dict[str, str] = {}
        top_pipe = _top_pipe(rules)
        if metrics["tensor_pipe_pct"] is None and top_pipe and (top_pipe.get("pipe") or "").startswith("Tensor"):
            metrics["tensor_pipe_pct"] = top_pipe["pct_of_elapsed"]
            sources["tensor_pipe_pct"] = "ncu HighPipeUtilization rule (% of elapsed cycles)"
            missing.remove("tensor_pipe_pct")
        stalls = _stalls(prof, lids)
        if not stalls:
            missing.append("warp stall reasons")
        local, local_known = _local_memory(prof, lids, rules, metrics["registers_per_thread"])
        if not local_known:
            missing.append("local memory traffic")
        memory_unit = _memory_unit(metrics)
        bound, bound_note = _bound(metrics, top_pipe, memory_unit)
        first = prof.launches.filter(prof.launches["launch_id"] == lids[0]).row(0, named=True)
        out.append(
            KernelVerdict(
                name=name,
                launches=len(lids),
                duration_ns=metrics["duration_ns"],
                bound=bound,
                bound_note=bound_note,
                top_pipe=top_pipe,
                local_memory=local,
                metric_sources=sources,
                memory_unit=memory_unit,
                metrics=metrics,
                occupancy_limiter=limiter,
                block_limits=limits,
                stalls=stalls,
                uncoalesced=_uncoalesced(prof, lids),
                bank_conflicts=_bank_conflicts(prof, lids),
                divergence=_divergence(metrics),
                rules=rules,
                roofline=roofline(prof, lids[0], device_name),
                grid=first["grid"],
                block=first["block"],
                missing=tuple(missing),
            )
        )
    return out


def limiter_fix(limiter: str | None) -> str | None:
    fixes = [_LIMIT_FIXES[k] for k in (limiter or "").split(" / ") if k in _LIMIT_FIXES]
    return "; or ".join(fixes) if fixes else None
