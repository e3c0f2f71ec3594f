"""Compiled programs: what torch.compile and CUDA graphs did in a trace.

torch.profiler marks a compiled program's work in its own names:

- ``Torch-Compiled Region: F/C`` around each call of a compiled frame (F: the frame, C: its
  compile; ``0/1`` is frame 0's first recompile), ``CompiledFunction`` and, on autograd's
  thread, ``CompiledFunctionBackward`` (AOTAutograd's forward and backward), and
  ``## Call CompiledFxGraph <hash> ##`` around the generated code Inductor runs;
- Inductor's generated kernels (``triton_poi_``, ``triton_per_``, ``triton_red_``,
  ``triton_tem_``...), launched through the driver (``cuLaunchKernel``/``cuLaunchKernelEx``),
  each under a host range of the same name;
- a CUDA graph replay (``mode="reduce-overhead"``'s CUDA graph trees, ``torch.cuda.graphs``):
  one ``cudaGraphLaunch`` whose correlation id every kernel of the graph carries.

A host launch call inside a compiled range (on the same thread) launched the compiled code's
work; the rest of the step (the optimizer, the loss when it is not compiled, the batch fetch)
ran eager. ``compiled_view`` splits the kernels, their time and the launches that way, and
names the eager operators outside the regions; the run's record of what Dynamo did
(``proflab run``: graph breaks, recompiles, CUDA graph skips) rides along where there is one.
A range whose end the trace lost (a missing, zero or negative duration) is not a region: it
is counted as unclosed and said.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from proflab.analysis.timeline.intervals import IntervalSet
from proflab.analysis.timeline.threads import ThreadClock
from proflab.model import Trace

__all__ = ["Compiled", "compiled_view", "REGION", "TRITON", "GRAPH_LAUNCH", "region_spans"]

REGION = r"^(?:Torch-Compiled Region|CompiledFunction(?:Backward)?$|## Call CompiledFxGraph)"
TRITON = r"^triton_"
GRAPH_LAUNCH = r"^(?:cudaGraphLaunch|cuGraphLaunch)"
_FRAME_ID = r"^Torch-Compiled Region: (\d+)/(\d+)"
_TOP_EAGER = 5


@dataclass(frozen=True)
class Compiled:
    """What a trace shows of compiled code (times in ns, counts over the analysed trace).

    ``frames``: each compiled frame id seen (``"0"``) with its compile ids (``["0/0", "0/1"]``);
    ``kernels``/``kernel_ns``: all kernels, those launched inside compiled regions
    (``in_regions``), Inductor's (``triton``) and those replayed from CUDA graphs (``graphed``);
    ``launches``: host launch calls inside and outside the regions, and graph replays;
    ``eager_ops``: the operators behind the most kernel time outside the regions;
    ``record``: the run's record of what Dynamo did, when the trace comes from ``proflab run``."""

    regions: int
    frames: dict[str, list[str]]
    compiled_functions: int
    compiled_backward: int
    fx_graph_calls: int
    unclosed: int
    kernels: dict[str, int]
    kernel_ns: dict[str, int]
    launches: dict[str, int]
    steps: int
    eager_ops: list[dict[str, Any]] = field(default_factory=list)
    record: dict | None = None
    missing: tuple[str, ...] = ()
    # kernel name -> the compiled region that launched it most often ("Torch-Compiled Region:
    # 0/0", or "CompiledFunctionBackward" for the compiled backward, which names no frame)
    kernel_regions: dict[str, str] = field(default_factory=dict)
    # per step, the host's time on the stepping thread outside the compiled regions (ns): the
    # eager Python, the loss, the optimizer, the batch fetch; None without profiler steps
    host_outside_ns: int | None = None

    @property
    def compiled(self) -> bool:
        """The program ran compiled code in this trace (or, with no trace of it, its run says so)."""
        rec = self.record or {}
        return bool(self.regions or self.fx_graph_calls or self.compiled_functions or self.kernels.get("triton")
                    or (rec.get("frames") or {}).get("ok"))

    @property
    def graphed(self) -> bool:
        """Work replayed from CUDA graphs."""
        return self.launches.get("graph_replays", 0) > 0

    @property
    def recompiled_frames(self) -> dict[str, list[str]]:
        """Frames the trace shows under more than one compile id (``F/1`` and later)."""
        return {f: ids for f, ids in self.frames.items() if len(ids) > 1 or any(not i.endswith("/0") for i in ids)}

    def per_step(self, n: int | float) -> float | None:
        return None if not self.steps else round(n / self.steps, 1)

    def to_dict(self) -> dict[str, Any]:
        ms = lambda ns: round(ns / 1e6, 3)  # noqa: E731
        return {
            "compiled": self.compiled,
            "graphed": self.graphed,
            "regions": self.regions,
            "frames": self.frames,
            "compiled_functions": self.compiled_functions,
            "compiled_backward": self.compiled_backward,
            "fx_graph_calls": self.fx_graph_calls,
            "unclosed_ranges": self.unclosed,
            "kernels": self.kernels,
            "kernel_ms": {k: ms(v) for k, v in self.kernel_ns.items()},
            "in_regions_pct": None if not self.kernel_ns.get("all") else round(100 * self.kernel_ns["in_regions"] / self.kernel_ns["all"], 1),
            "launches": self.launches,
            "launches_per_step": {k: self.per_step(v) for k, v in self.launches.items()},
            "eager_ops": self.eager_ops,
            "host_outside_ms_per_step": None if self.host_outside_ns is None or not self.steps
            else round(self.host_outside_ns / self.steps / 1e6, 3),
            "record": _record_summary(self.record),
            "missing": list(self.missing),
        }


def _record_summary(rec: dict | None) -> dict | None:
    if not isinstance(rec, dict):
        return None
    keep = ("frames", "unique_graphs", "compile_count", "graph_break_count", "recompile_count", "cudagraph_skip_count", "missing")
    return {k: rec[k] for k in keep if k in rec}


def region_spans(trace: Trace) -> tuple[pl.DataFrame, int]:
    """The compiled ranges (``tid``, ``start_ns``, ``end_ns``, ``name``) and how many the trace
    left unclosed (no usable duration)."""
    r = trace.cpu.select("cat", "name", "tid", "start_ns", "dur_ns").filter(
        pl.col("cat").is_in(["cpu_op", "user_annotation"]) & pl.col("name").str.contains(REGION)
    )
    # (a reader fills a missing duration with 0: no call of compiled code takes no time)
    closed = pl.col("dur_ns").is_not_null() & (pl.col("dur_ns") > 0) & pl.col("start_ns").is_not_null()
    bad = r.filter(~closed)
    ok = r.filter(closed)
    return ok.select("tid", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"), "name"), bad.height


def in_spans(spans: pl.DataFrame, tid: pl.Series, t: pl.Series) -> np.ndarray:
    """Whether each (thread, time) falls inside one of ``spans`` of its own thread."""
    if spans.height == 0 or tid.len() == 0:
        return np.zeros(tid.len(), dtype=bool)
    clock = ThreadClock([tid, spans["tid"]], [t, spans["start_ns"], spans["end_ns"]])
    s = IntervalSet.from_spans(clock.key(spans["tid"], spans["start_ns"]), clock.key(spans["tid"], spans["end_ns"]))
    k = clock.key(tid, t)
    return s.contains(k)


def compiled_view(trace: Trace, launches: pl.DataFrame, kernel_ops: pl.DataFrame | None = None,
                  record: dict | None = None, regions: tuple[pl.DataFrame, int] | None = None) -> Compiled:
    """The compiled program's split of the trace (see the module doc). ``launches``: the host
    launch calls by correlation (``gaps.launch_calls``); ``kernel_ops``: the operator behind
    each correlation (``Context.kernel_ops``); ``record``: ``proflab run``'s record of Dynamo;
    ``regions``: :func:`region_spans` where already found."""
    spans, unclosed = regions if regions is not None else region_spans(trace)
    names = spans["name"]
    ids = names.str.extract_groups(_FRAME_ID).struct.unnest().drop_nulls() if spans.height else pl.DataFrame()
    frames: dict[str, list[str]] = {}
    for f, c in ids.unique().sort(by=[pl.col(x).cast(pl.Int64) for x in ids.columns]).iter_rows() if ids.height else ():
        frames.setdefault(f, []).append(f"{f}/{c}")
    missing = []
    if unclosed:
        missing.append(f"{unclosed} compiled range(s) without an end in the trace: their work is counted as eager")

    k = trace.gpu.select("kind", "name", "dur_ns", "correlation").filter(pl.col("kind") == "kernel")
    la = launches.select("correlation", "launch_name", "launch_start_ns", "tid")
    inside = in_spans(spans, la["tid"], la["launch_start_ns"])
    la = la.with_columns(pl.Series("in_region", inside), pl.col("launch_name").str.contains(GRAPH_LAUNCH).alias("graph"))
    k = k.join(la.select("correlation", "in_region", "graph"), on="correlation", how="left")
    linked = k["in_region"].is_not_null()
    if k.height and not linked.any() and spans.height:
        missing.append("the kernels carry no correlation to a host launch: which ran inside compiled regions is unknown")
    triton = k["name"].str.contains(TRITON).fill_null(False)
    in_region = k["in_region"].fill_null(False)
    graph = k["graph"].fill_null(False)
    dur = k["dur_ns"].fill_null(0)

    def ns(mask: pl.Series) -> int:
        return int(dur.filter(mask).sum() or 0)

    kernels = {"all": k.height, "in_regions": int(in_region.sum()), "outside": int((linked & ~in_region).sum()),
               "unlinked": int((~linked).sum()), "triton": int(triton.sum()), "graphed": int(graph.sum())}
    kernel_ns = {"all": int(dur.sum() or 0), "in_regions": ns(in_region), "outside": ns(linked & ~in_region),
                 "triton": ns(triton), "graphed": ns(graph)}
    launch_counts = {
        "in_regions": int(la.filter(pl.col("in_region") & ~pl.col("graph")).height),
        "outside": int(la.filter(~pl.col("in_region") & ~pl.col("graph")).height),
        "graph_replays": int(la.filter(pl.col("graph")).height),  # (a replay's kernels all carry its correlation)
    }
    eager: list[dict[str, Any]] = []
    if kernel_ops is not None and kernel_ops.height and spans.height:
        out = k.filter(linked & ~in_region).join(kernel_ops, on="correlation", how="left")
        top = (out.group_by(pl.col("op").fill_null("(no operator)")).agg(pl.col("dur_ns").sum(), pl.len().alias("kernels"))
               .sort(["dur_ns", "op"], descending=[True, False]).head(_TOP_EAGER))  # fmt: skip
        eager = [{"op": o, "kernel_ms": round(d / 1e6, 3), "kernels": int(n)} for o, d, n in top.iter_rows()]
    count = lambda pattern: int(names.str.contains(pattern).sum()) if spans.height else 0  # noqa: E731
    regions_of = _kernel_regions(spans, k.filter(in_region).select("name", "correlation"), la) if in_region.any() else {}
    return Compiled(
        regions=count(r"^Torch-Compiled Region"),
        frames=frames,
        compiled_functions=count(r"^CompiledFunction$"),
        compiled_backward=count(r"^CompiledFunctionBackward$"),
        fx_graph_calls=count(r"^## Call CompiledFxGraph"),
        unclosed=unclosed,
        kernels=kernels,
        kernel_ns=kernel_ns,
        launches=launch_counts,
        steps=trace.steps.height,
        eager_ops=eager,
        record=record if isinstance(record, dict) else None,
        missing=tuple(missing),
        kernel_regions=regions_of,
        host_outside_ns=_host_outside(trace, spans) if spans.height else None,
    )


def _host_outside(trace: Trace, spans: pl.DataFrame) -> int | None:
    """The host's time within its profiler steps while no compiled range runs on any thread
    (ns, all steps together): the main thread inside ``loss.backward()`` waits for autograd's
    thread, which runs the compiled backward, so a range of either thread counts."""
    st = trace.cpu.select("cat", "name", "start_ns", "dur_ns").filter(
        (pl.col("cat") == "user_annotation") & pl.col("name").str.starts_with("ProfilerStep#"))
    if st.height == 0:
        return None
    covered = IntervalSet.from_spans(spans["start_ns"].to_numpy(), spans["end_ns"].to_numpy())
    a = st["start_ns"].to_numpy()
    b = a + st["dur_ns"].to_numpy()
    return int((b - a).sum() - covered.covered_within(a, b).sum())


def _kernel_regions(spans: pl.DataFrame, kernels: pl.DataFrame, launches: pl.DataFrame) -> dict[str, str]:
    """Each kernel name's compiled region: the outermost named range (a compiled frame's call,
    or the compiled backward) around its launch on the launching thread, the most common one.
    These ranges do not nest in one another on a thread: the latest one to start before a
    launch holds it if it has not ended (a loop over threads, not events)."""
    outer = spans.filter(pl.col("name").str.contains(r"^(?:Torch-Compiled Region|CompiledFunctionBackward$)"))
    at = kernels.join(launches.select("correlation", "tid", pl.col("launch_start_ns").alias("t")), on="correlation")
    found = []
    for (tid,), o in outer.sort("start_ns").group_by("tid"):
        mine = at.filter(pl.col("tid") == tid)
        if mine.height == 0:
            continue
        t = mine["t"].to_numpy()
        i = np.searchsorted(o["start_ns"].to_numpy(), t, side="right") - 1
        held = (i >= 0) & (t < o["end_ns"].to_numpy()[np.maximum(i, 0)])
        found.append(pl.DataFrame({"name": mine["name"].filter(pl.Series(held)),
                                   "region": o["name"].gather(i[held])}))
    if not found:
        return {}
    top = (pl.concat(found).group_by("name", "region").len()
           .sort(["name", "len", "region"], descending=[False, True, False]).unique("name", keep="first"))
    return dict(top.select("name", "region").iter_rows())
