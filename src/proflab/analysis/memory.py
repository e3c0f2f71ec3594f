"""GPU memory over the profiled window: the peak, when in the step it comes, what holds it.

Inputs are the allocator's own events (Kineto ``[memory]``, recorded with
``profile_memory=True``): every allocation and free with the device's allocated and reserved
totals after it. From them, per CUDA device:

- the peak allocated and reserved bytes, per device and per step, and the phase of the step the
  peak falls in: ``optimizer`` (inside ``Optimizer.step#…``), ``zero_grad``, ``backward``
  (inside ``autograd::engine::evaluate_function…`` or a ``## backward ##`` range), ``forward``
  (a ``## forward ##`` range, or before the step's first backward work), ``other``;
- the allocations live at the peak, replayed by address, each tied to the operator that made it
  (the innermost ``cpu_op`` enclosing the event on its thread), the autograd node or module
  around it, and the user's source line where the trace has Python stacks;
- a category for each live allocation, an approximation of PyTorch's memory timeline
  (``torch/profiler/_memory_profiler.py``) from phases and lifetimes rather than from its
  data-flow graph: ``activation`` (made in the forward, freed in the backward), ``gradient``
  (made in the backward and outliving it), ``optimizer_state`` (made in the optimizer step and
  outliving it), ``temporary`` (freed in the phase that made it), ``retained`` (made in a step
  that ended and never freed in the window: what a leak is made of), ``persistent`` (allocated
  before the window: parameters, optimizer state, buffers and inputs; split into an estimate of
  parameters and optimizer state from the gradients' bytes and the optimizer's class where the
  trace has both), ``other``.

Allocation events are host-timestamped (the caching allocator runs when the op is dispatched),
so steps here are the host's ``ProfilerStep#N`` ranges; a trace without them is cut into
iterations at the end of each ``Optimizer.step`` (said in ``notes``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from proflab.errors import InputError
from proflab.model import Trace
from proflab.model.findings import Missing

__all__ = ["MemoryAnalysis", "analyze_memory", "memory_for_trace", "PHASES", "CATEGORIES"]

MIB = float(1 << 20)
PHASES = ("forward", "backward", "optimizer", "zero_grad", "other")
CATEGORIES = ("persistent", "parameters", "optimizer_state", "gradient", "activation", "temporary", "retained", "other")
# state tensors per parameter, by optimizer class (torch.optim defaults)
_STATES = {"Adam": 2, "AdamW": 2, "Adamax": 2, "NAdam": 2, "RAdam": 2, "Adadelta": 2, "RMSprop": 1, "Adagrad": 1, "SGD": None, "Lion": 1}
_PY_FRAME = r"\.py\(\d+\)"  # "file.py(123): function"
_NOT_USER = r"^(torch/|<|nn\.Module|enum\.py|threading\.py|contextlib\.py|functools\.py|typing\.py|site-packages/)"


def _mib(b: float | int | None, nd: int = 3) -> float | None:
    return None if b is None else round(float(b) / MIB, nd)


@dataclass
class MemoryAnalysis:
    sources: dict[str, Any]
    devices: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    snapshot: dict[str, Any] | None = None
    nvml: list[dict[str, Any]] | None = None
    collection: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)
    timelines: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)  # for plots; not serialised
    step_bounds: list[tuple[int, int, int]] = field(default_factory=list)  # (step, start_ns, end_ns)
    origin_ns: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "sources": self.sources,
            "devices": self.devices,
            "steps": self.steps,
            "snapshot": self.snapshot,
            "nvml": self.nvml,
            "collection": self.collection,
            "notes": list(self.notes),
        }


# -- intervals --------------------------------------------------------------------------------


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(starts) == 0:
        return starts, ends
    o = np.argsort(starts, kind="stable")
    s, e = starts[o], ends[o]
    out_s, out_e = [s[0]], [e[0]]
    for a, b in zip(s[1:], e[1:]):
        if a <= out_e[-1]:
            out_e[-1] = max(out_e[-1], b)
        else:
            out_s.append(a)
            out_e.append(b)
    return np.asarray(out_s, dtype=np.int64), np.asarray(out_e, dtype=np.int64)


def _inside(ts: np.ndarray, iv: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    s, e = iv
    if len(s) == 0:
        return np.zeros(len(ts), dtype=bool)
    k = np.searchsorted(s, ts, side="right") - 1
    return (k >= 0) & (ts <= e[np.maximum(k, 0)])


def _phase_intervals(cpu: pl.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = cpu.filter(pl.col("cat").is_in(["cpu_op", "user_annotation", "python_function"])).select(
        "name", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns")
    )
    pats = {
        "optimizer": pl.col("name").str.starts_with("Optimizer.step#"),
        "zero_grad": pl.col("name").str.starts_with("Optimizer.zero_grad#"),
        "backward": pl.col("name").str.starts_with("autograd::engine::evaluate_function") | pl.col("name").str.contains(r"(?i)^## ?backward ?##"),
        "forward_range": pl.col("name").str.contains(r"(?i)^## ?forward ?##"),
    }
    out = {}
    for k, cond in pats.items():
        t = rng.filter(cond)
        out[k] = _union(t["start_ns"].to_numpy().astype(np.int64), t["end_ns"].to_numpy().astype(np.int64))
    return out


def _phases(ts: np.ndarray, iv: dict, first_bwd_in_step: np.ndarray) -> np.ndarray:
    ph = np.full(len(ts), "other", dtype=object)
    fwd = _inside(ts, iv["forward_range"]) | (ts < first_bwd_in_step)
    ph[fwd] = "forward"
    ph[_inside(ts, iv["backward"])] = "backward"
    ph[_inside(ts, iv["zero_grad"])] = "zero_grad"
    ph[_inside(ts, iv["optimizer"])] = "optimizer"
    return ph


# -- steps ------------------------------------------------------------------------------------


def _step_bounds(trace: Trace, lo: int, hi: int, notes: list[str]) -> list[tuple[int, int, int]]:
    st = trace.steps.sort("start_ns")
    if st.height:
        notes.append("allocation events are host-timestamped: steps are the host's ProfilerStep ranges")
        return [(int(r["step"]), int(r["start_ns"]), int(r["end_ns"])) for r in st.iter_rows(named=True)]
    opt = trace.cpu.filter(
        pl.col("name").str.starts_with("Optimizer.step#") & pl.col("cat").is_in(["user_annotation", "cpu_op"])
    ).sort("start_ns")
    if opt.height == 0:
        return []
    # host ranges only (the GPU-side copy of the annotation runs later); overlapping ones merged
    _, ends_arr = _union(opt["start_ns"].to_numpy().astype(np.int64), (opt["start_ns"] + opt["dur_ns"]).to_numpy().astype(np.int64))
    ends = ends_arr.tolist()
    notes.append(
        f"the trace has no ProfilerStep ranges: iterations are cut at the end of each Optimizer.step ({len(ends)}); "
        "allocations after the last one are a partial iteration, not counted as a step"
    )
    out, prev = [], lo
    for i, e in enumerate(ends):
        out.append((i, int(prev), int(e)))
        prev = e
    return out


# -- attribution ------------------------------------------------------------------------------


class _Attributor:
    """The innermost cpu_op, the outermost cpu_op (autograd node or top-level op), the
    innermost nn.Module and the innermost user source frame around (tid, ts)."""

    def __init__(self, cpu: pl.DataFrame) -> None:
        t = cpu.filter(pl.col("cat").is_in(["cpu_op", "python_function"])).select(
            "cat", "name", "tid", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns")
        )
        self.by_tid: dict[int, dict[str, tuple]] = {}
        for (tid,), g in t.group_by("tid"):
            parts = {}
            for key, cond in (
                ("op", pl.col("cat") == "cpu_op"),
                ("module", (pl.col("cat") == "python_function") & pl.col("name").str.starts_with("nn.Module: ")),
                ("src", (pl.col("cat") == "python_function") & pl.col("name").str.contains(_PY_FRAME) & ~pl.col("name").str.contains(_NOT_USER)),
            ):
                x = g.filter(cond).sort("start_ns")
                parts[key] = (x["start_ns"].to_numpy(), x["end_ns"].to_numpy(), x["name"].to_list())
            self.by_tid[tid] = parts

    @staticmethod
    def _around(part, ts: int, innermost: bool = True) -> str | None:
        s, e, names = part
        if len(s) == 0:
            return None
        k = int(np.searchsorted(s, ts, side="right"))
        idx = np.nonzero((s[:k] <= ts) & (e[:k] >= ts))[0]
        if len(idx) == 0:
            return None
        return names[idx[-1] if innermost else idx[0]]

    def __call__(self, tid: int, ts: int) -> dict[str, str | None]:
        p = self.by_tid.get(tid)
        if p is None:
            return {"op": None, "within": None, "module": None, "source": None}
        inner, outer = self._around(p["op"], ts, True), self._around(p["op"], ts, False)
        mod = self._around(p["module"], ts, True)
        return {
            "op": inner,
            "within": outer if outer != inner else None,
            # the module's class (Kineto numbers each instance: LayerNorm_3), so layers group
            "module": None if mod is None else re.sub(r"_\d+$", "", mod[len("nn.Module: "):]),
            "source": self._around(p["src"], ts, True),
        }


# -- the series for charts --------------------------------------------------------------------

SERIES_MAX_POINTS = 2000


def _series(ts: np.ndarray, alloc: np.ndarray, res: np.ndarray, origin_ns: int, bounds, max_points: int = SERIES_MAX_POINTS) -> dict[str, Any]:
    """Allocated and reserved MiB over the window, at most ``max_points`` events: where there
    are more, the events are cut into equal runs and each run keeps its highest and lowest
    allocated and its highest reserved event, so every point is a measured one and the peaks
    are kept. Step starts in ms on the same clock (the first allocation event is 0)."""
    n = len(ts)
    if n <= max_points:
        keep = np.arange(n)
    else:
        chunks = np.array_split(np.arange(n), max_points // 3)
        keep = np.unique(np.concatenate([
            [c[int(np.argmax(alloc[c]))], c[int(np.argmin(alloc[c]))], c[int(np.argmax(res[c]))]] for c in chunks
        ]))
    end = int(ts[-1]) if n else origin_ns
    return {
        "events": n,
        "points": len(keep),
        "t_ms": [round((int(ts[i]) - origin_ns) / 1e6, 4) for i in keep],
        "allocated_mib": [_mib(alloc[i]) for i in keep],
        "reserved_mib": [_mib(res[i]) for i in keep],
        "step_starts_ms": [
            {"step": step, "t_ms": round((s0 - origin_ns) / 1e6, 4)} for step, s0, _ in bounds if origin_ns <= s0 <= end
        ],
    }


# -- the analysis -----------------------------------------------------------------------------


def _device_totals(trace: Trace, nvml: pl.DataFrame | None) -> dict[int, tuple[int, str]]:
    out: dict[int, tuple[int, str]] = {}
    for r in trace.devices.iter_rows(named=True):
        if r.get("total_memory_bytes") and r.get("device") is not None:
            out[int(r["device"])] = (int(r["total_memory_bytes"]), "trace deviceProperties totalGlobalMem")
    if nvml is not None:
        for (d,), g in nvml.group_by("device"):
            if d is not None and int(d) not in out and g["mem_total_bytes"].max():
                out[int(d)] = (int(g["mem_total_bytes"].max()), "NVML memory total")
    return out


def analyze_memory(
    trace: Trace,
    events: pl.DataFrame,
    *,
    profile_memory: bool | None = None,
    nvml: pl.DataFrame | None = None,
    snapshot: dict[str, Any] | None = None,
    sources: dict[str, Any] | None = None,
    top: int = 8,
) -> MemoryAnalysis:
    """The memory analysis of one trace and its ``[memory]`` events (``readers.memory``)."""
    a = MemoryAnalysis(sources=dict(sources or {}))
    a.snapshot = snapshot
    totals = _device_totals(trace, nvml)
    if nvml is not None:
        a.nvml = [
            {
                "device": int(d),
                "samples": g.height,
                "max_used_mib": _mib(g["mem_used_bytes"].max()),
                "total_mib": _mib(g["mem_total_bytes"].max()),
                "note": "NVML counts every process and the CUDA context, not only the allocator's blocks",
            }
            for (d,), g in sorted(nvml.group_by("device"), key=lambda kv: kv[0][0])
        ]
    cuda = events.filter(pl.col("device_type") == 1) if events.height else events
    if cuda.height == 0:
        why = (
            "the trace was recorded with profile_memory but holds no CUDA allocation in the window"
            if profile_memory
            else "the trace has no [memory] events (record with profile_memory=True, or proflab run --profile-memory)"
        )
        a.missing.append(Missing("memory events", why, ("memory peak", "memory_leak", "memory_fragmentation", "memory_headroom")))
        return a
    lo, hi = int(cuda["ts_ns"].min()), int(cuda["ts_ns"].max())
    a.origin_ns = lo
    bounds = _step_bounds(trace, lo, hi, a.notes)
    a.step_bounds = bounds
    if not bounds:
        a.missing.append(Missing("steps", "no ProfilerStep ranges and no Optimizer.step: no per-step figures", ("memory_leak",)))
    iv = _phase_intervals(trace.cpu)
    attrib = _Attributor(trace.cpu)
    opt_names = trace.cpu.filter(pl.col("name").str.starts_with("Optimizer.step#"))["name"].unique().to_list()
    opt_class = None
    if len(opt_names) == 1:
        m = re.match(r"Optimizer\.step#(\w+)\.step", opt_names[0])
        opt_class = m.group(1) if m else None

    for (dev,), d in sorted(cuda.group_by("device", maintain_order=True), key=lambda kv: kv[0][0]):
        dev = int(dev)
        a.devices.append(_device(a, trace, d, dev, bounds, iv, attrib, totals.get(dev), opt_class, top))
    n_steps = len(bounds)
    if n_steps:
        inside = cuda.filter((pl.col("ts_ns") >= bounds[0][1]) & (pl.col("ts_ns") <= bounds[-1][2]))
        a.collection = {
            "memory_events": events.height,
            "memory_events_per_step": round(inside.height / n_steps, 1),
        }
    return a


def _device(a, trace, d, dev, bounds, iv, attrib, total, opt_class, top) -> dict[str, Any]:
    ts = d["ts_ns"].to_numpy().astype(np.int64)
    nb = d["bytes"].to_numpy().astype(np.int64)
    alloc = d["total_allocated"].to_numpy().astype(np.int64)
    res = d["total_reserved"].fill_null(0).to_numpy().astype(np.int64)
    addr = d["addr"].fill_null(-1).to_numpy().astype(np.int64)
    tid = d["tid"].fill_null(-1).to_numpy().astype(np.int64)
    a.timelines[dev] = {"ts_ns": ts, "allocated": alloc, "reserved": res}
    n = len(ts)
    # the step of each event, and the first backward work of each step (forward before it)
    step_of = np.full(n, -1, dtype=np.int64)
    first_bwd = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    bwd_s = iv["backward"][0]
    for i, (_, s0, s1) in enumerate(bounds):
        m = (ts >= s0) & (ts <= s1)
        step_of[m] = i
        k = np.searchsorted(bwd_s, s0)
        fb = bwd_s[k] if k < len(bwd_s) and bwd_s[k] <= s1 else s1 + 1
        first_bwd[m] = fb
    if not bounds:
        first_bwd[:] = bwd_s[0] if len(bwd_s) else np.iinfo(np.int64).max
    phase = _phases(ts, iv, first_bwd)

    ipk = int(np.argmax(alloc))  # the first event at the peak
    ipr = int(np.argmax(res))
    base_alloc = int(alloc[0] - nb[0])

    # lifetimes: replay by address
    free_at = np.full(n, -1, dtype=np.int64)  # for each allocation event: the index of its free
    open_: dict[int, int] = {}
    unknown_frees = np.zeros(n, dtype=np.int64)  # bytes freed that were allocated before the window
    reserved_grew_despite_free = []
    for i in range(n):
        if nb[i] > 0:
            open_[addr[i]] = i
            if i > 0 and res[i] > res[i - 1]:
                cached_free = int(res[i - 1] - alloc[i - 1])
                if cached_free >= nb[i]:
                    reserved_grew_despite_free.append((i, int(nb[i]), cached_free, int(res[i] - res[i - 1])))
        elif nb[i] < 0:
            j = open_.pop(addr[i], None)
            if j is None:
                unknown_frees[i] = -nb[i]
            else:
                free_at[j] = i
    live = [i for i in range(ipk + 1) if nb[i] > 0 and (free_at[i] == -1 or free_at[i] > ipk)]
    live_bytes = int(sum(int(nb[i]) for i in live))
    pre_live = int(alloc[ipk]) - live_bytes

    def category(i: int) -> str:
        p, f = phase[i], free_at[i]
        fp = phase[f] if f >= 0 else None
        same_step = f >= 0 and step_of[f] == step_of[i]
        if p == "optimizer":
            return "temporary" if f >= 0 and fp == "optimizer" and same_step else "optimizer_state"
        if p == "backward":
            return "temporary" if f >= 0 and fp == "backward" and same_step else "gradient"
        if f == -1:
            ended = step_of[i] >= 0 and bounds and bounds[step_of[i]][2] < ts[-1]
            return "retained" if ended or step_of[i] == -1 else "other"
        if p == "forward":
            if fp == "backward":
                return "activation"
            if fp == "forward" and same_step:
                return "temporary"
            return "other"  # freed later, outside the backward: inputs, outputs, the loss
        return "temporary" if fp == p and same_step else "other"

    cats: dict[str, int] = {c: 0 for c in CATEGORIES}
    rows = []
    for i in live:
        c = category(i)
        cats[c] += int(nb[i])
        rows.append((i, c))
    cats["persistent"] = pre_live
    # split what was allocated before the window, where the trace allows an estimate
    grad_bytes = cats["gradient"]
    est = None
    if pre_live > 0 and grad_bytes > 0 and opt_class in _STATES:
        k = _STATES[opt_class]
        params = min(grad_bytes, pre_live)
        state = min(k * grad_bytes, pre_live - params) if k else None
        if state is not None:
            est = {"parameters": params, "optimizer_state": state}
            cats["parameters"] += params
            cats["optimizer_state"] += state
            cats["persistent"] = pre_live - params - state
    # largest live allocations at the peak, grouped by who made them
    groups: dict[tuple, list] = {}
    for i, c in rows:
        who = attrib(int(tid[i]), int(ts[i]))
        key = (who["op"], who["within"], who["module"], who["source"], phase[i], c)
        g = groups.setdefault(key, [0, 0])
        g[0] += int(nb[i])
        g[1] += 1
    top_rows = sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]
    peak_step = bounds[step_of[ipk]][0] if step_of[ipk] >= 0 else None
    total_b, total_src = total if total else (None, None)
    by_cat = {c: _mib(v) for c, v in cats.items() if v}
    scored = {c: v for c, v in cats.items() if v and c != "other"}
    dominant = max(scored, key=scored.get) if scored else None
    out: dict[str, Any] = {
        "device": dev,
        "events": n,
        "allocated_at_window_start_mib": _mib(base_alloc),
        "allocated_at_window_end_mib": _mib(alloc[-1]),
        "peak_allocated_mib": _mib(alloc[ipk]),
        "peak_reserved_mib": _mib(res[ipr]),
        "reserved_at_peak_mib": _mib(res[ipk]),
        "reserved_unused_at_peak_mib": _mib(res[ipk] - alloc[ipk]),
        "peak_at_ms": round((ts[ipk] - a.origin_ns) / 1e6, 3),
        "peak_step": peak_step,
        "peak_phase": str(phase[ipk]),
        "peak_op": attrib(int(tid[ipk]), int(ts[ipk]))["op"] if nb[ipk] > 0 else None,
        "device_memory_mib": _mib(total_b),
        "device_memory_source": total_src,
        "peak_allocated_pct_of_device": None if not total_b else round(100 * alloc[ipk] / total_b, 2),
        "peak_reserved_pct_of_device": None if not total_b else round(100 * res[ipr] / total_b, 2),
        "by_category_mib": by_cat,
        "dominant_category": dominant,
        "persistent_split": None if est is None else {
            "parameters_mib": _mib(est["parameters"]),
            "optimizer_state_mib": _mib(est["optimizer_state"]),
            "optimizer": opt_class,
            "assumption": f"parameters ~ the gradients' bytes; {opt_class} keeps {_STATES[opt_class]} state tensor(s) of each parameter's size",
        },
        "top_allocations": [
            {
                "op": k[0], "within": k[1], "module": k[2], "source": k[3], "phase": k[4], "category": k[5],
                "mib": _mib(v[0]), "count": v[1],
            }
            for k, v in top_rows
        ],
        "reserved_growth_with_free_cache": {
            "events": len(reserved_grew_despite_free),
            "reserved_added_mib": _mib(sum(x[3] for x in reserved_grew_despite_free)),
            "largest_request_mib": _mib(max((x[1] for x in reserved_grew_despite_free), default=0)),
            "cached_free_then_mib": _mib(max((x[2] for x in reserved_grew_despite_free if x[1] == max(y[1] for y in reserved_grew_despite_free)), default=0)) if reserved_grew_despite_free else 0.0,
        },
    }
    out["series"] = _series(ts, alloc, res, a.origin_ns, bounds)
    # per step
    for si, (step, s0, s1) in enumerate(bounds):
        m = np.nonzero(step_of == si)[0]
        if len(m) == 0:
            continue
        j = m[int(np.argmax(alloc[m]))]
        kept = m[(nb[m] > 0) & (free_at[m] == -1)]
        a.steps.append(
            {
                "step": step,
                "device": dev,
                "peak_allocated_mib": _mib(alloc[j]),
                "peak_reserved_mib": _mib(res[m].max()),
                "peak_phase": str(phase[j]),
                "min_allocated_mib": _mib(alloc[m].min()),
                "end_allocated_mib": _mib(alloc[m[-1]]),
                "never_freed_mib": _mib(nb[kept].sum()),  # allocated in the step, still live at the window's end
                "events": int(len(m)),
            }
        )
    # what stays allocated after each step: by who made it (for the leak rule)
    retained: dict[tuple, list] = {}
    for i in range(n):
        if nb[i] > 0 and free_at[i] == -1 and step_of[i] >= 0 and bounds[step_of[i]][2] < ts[-1] and phase[i] not in ("optimizer",):
            who = attrib(int(tid[i]), int(ts[i]))
            key = (who["op"], who["within"], who["source"], phase[i])
            g = retained.setdefault(key, [0, 0])
            g[0] += int(nb[i])
            g[1] += 1
    out["retained_never_freed"] = [
        {"op": k[0], "within": k[1], "source": k[2], "phase": k[3], "mib": _mib(v[0]), "count": v[1]}
        for k, v in sorted(retained.items(), key=lambda kv: -kv[1][0])[:top]
    ]
    return out


# -- from a trace file or run directory -------------------------------------------------------


_SCAN_UNMARKED_BYTES = 64 << 20


def _has_nsys_memory_table(path: Path) -> bool:
    import sqlite3
    import urllib.parse

    try:
        con = sqlite3.connect(f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro", uri=True)
        try:
            return con.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='CUDA_GPU_MEMORY_USAGE_EVENTS'"
            ).fetchone() is not None
        finally:
            con.close()
    except sqlite3.Error:
        return False


def _run_dir_of(source: str | None) -> Path | None:
    if not source:
        return None
    p = Path(source).resolve()
    for parent in (p.parent, p.parent.parent, p.parent.parent.parent):
        if (parent / "meta.json").is_file() and (parent / "traces").is_dir():
            return parent
    return None


def memory_for_trace(trace: Trace) -> MemoryAnalysis | None:
    """Memory analysis of a trace read from a Kineto file: its ``[memory]`` events and, when
    the file lies in a ``proflab run`` directory, that run's NVML samples and snapshot. None
    when the trace is not a Kineto file (nsys exports: see ``sources``)."""
    from proflab.readers import memory as rm

    src = trace.meta.source
    if trace.meta.format == "nsys-sqlite" and src and Path(src).is_file():
        a = MemoryAnalysis(sources={"nsys_memory_usage": {"available": _has_nsys_memory_table(Path(src))}})
        if a.sources["nsys_memory_usage"]["available"]:
            a.missing.append(Missing(
                "memory events",
                "the export has CUDA_GPU_MEMORY_USAGE_EVENTS (nsys --cuda-memory-usage=true): device-level cudaMalloc/cudaFree, "
                "not the caching allocator's tensors; this version does not analyse it: record with torch.profiler "
                "profile_memory=True (proflab run --profile-memory) for the memory section",
                ("memory section",),
            ))
        return a
    if trace.meta.format != "kineto" or not src or not Path(src).is_file():
        return None
    recorded = trace.meta.profile_memory
    # (the JSON's size, which a .gz file holds ~10 times over: a 50 MB .gz of a 514 MB trace
    # was read whole again, 1.45 GB at the peak)
    size = trace.meta.size_bytes if trace.meta.size_bytes is not None else Path(src).stat().st_size
    if recorded is False or (recorded is None and size > _SCAN_UNMARKED_BYTES):
        # Kineto marks a trace recorded with profile_memory; an unmarked large file is not
        # read a second time on the chance that it holds [memory] events
        events, on, dropped = pl.DataFrame(schema=rm.MEMORY_SCHEMA), False, 0
    else:
        events, on, dropped = rm.kineto_memory(src)
    sources: dict[str, Any] = {
        "kineto_memory_events": {"available": events.height > 0, "events": events.height, "profile_memory": on},
    }
    run = _run_dir_of(src)
    nvml = snap = snap_problem = None
    if run is not None:
        nvml = rm.nvml_memory(run)
        sources["nvml"] = {"available": nvml is not None, "path": "monitor.parquet" if nvml is not None else None}
        snaps = sorted(run.glob("memory_snapshot_*.json.gz")) + sorted(run.glob("memory_snapshot_*.pickle"))
        if snaps:
            try:
                snap = rm.snapshot_summary(rm.snapshot(snaps[0]))
                sources["snapshot"] = {"available": True, "path": snaps[0].name}
            except InputError as e:  # refused or unreadable: the rest of the section stands
                sources["snapshot"] = {"available": False, "path": snaps[0].name, "why": e.problem}
                snap_problem = str(e)
        else:
            sources["snapshot"] = {"available": False}
    else:
        sources["nvml"] = {"available": False, "why": "not a proflab run directory"}
        sources["snapshot"] = {"available": False, "why": "not a proflab run directory"}
    sources["nsys_memory_usage"] = {"available": False, "why": "not an Nsight Systems export"}
    a = analyze_memory(trace, events, profile_memory=on, nvml=nvml, snapshot=snap, sources=sources)
    if dropped:
        a.notes.append(f"{dropped} [memory] event(s) without their sizes, or with values out of range, were dropped")
    if snap_problem:
        a.missing.append(Missing("memory snapshot", snap_problem, ("snapshot summary",)))
    if run is not None:
        _run_collection_cost(a, run)
    return a


# measured on an H100 (tests/data/memory/ground_truth.json): profile_memory's host cost per
# allocation event on host-bound loops, light profiler with and without it
PROFILE_MEMORY_US_PER_EVENT = (5.5, 9.2)


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _run_collection_cost(a: MemoryAnalysis, run: Path) -> None:
    """What ``--profile-memory`` cost this run: the run's own profiled against bare step time
    (the whole profiler), and the share the allocation events explain at the measured cost."""
    import json

    try:
        meta = json.loads((run / "meta.json").read_text())
    except (OSError, ValueError):
        return
    # (a damaged meta.json: anything not shaped as proflab writes it counts as absent)
    options = meta.get("options") if isinstance(meta, dict) else None
    if not isinstance(options, dict) or not options.get("profile_memory"):
        return
    c = a.collection or {}
    per_step = c.get("memory_events_per_step")
    processes = meta.get("processes")
    for p in processes if isinstance(processes, list) else []:
        st = p.get("step_times") if isinstance(p, dict) else None
        if not isinstance(st, dict):
            continue
        if _positive(st.get("bare_ms")) and _positive(st.get("profiled_ms")):
            c["run_bare_step_ms"] = st["bare_ms"]
            c["run_profiled_step_ms"] = st["profiled_ms"]
            c["run_profiled_over_bare"] = round(st["profiled_ms"] / st["bare_ms"], 3)
            break
    if per_step:
        lo, hi = (per_step * x / 1e3 for x in PROFILE_MEMORY_US_PER_EVENT)
        c["profile_memory_cost_ms_per_step"] = [round(lo, 3), round(hi, 3)]
        line = (
            f"--profile-memory recorded {per_step:g} allocation events per step; at {PROFILE_MEMORY_US_PER_EVENT[0]}-"
            f"{PROFILE_MEMORY_US_PER_EVENT[1]} us each (measured on an H100, host-bound loops; nothing measurable on GPU-bound ones) "
            f"that is {lo:.2f}-{hi:.2f} ms of host time per step"
        )
        if c.get("run_profiled_step_ms"):
            line += f", of the {c['run_profiled_step_ms'] - c['run_bare_step_ms']:.2f} ms the whole profiler added ({c['run_bare_step_ms']:.2f} ms bare, {c['run_profiled_step_ms']:.2f} ms profiled)"
        a.notes.append(line)
    a.collection = c
