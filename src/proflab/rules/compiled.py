"""Compiled code: graph breaks, recompiles and CUDA graph skips (``graph_breaks``,
``recompiles``, ``cudagraph_skipped``)).

Their evidence is Dynamo's own record of the run (``proflab run`` reads it as each process
ends: reasons, lines, compile times; ``analysis.timeline.compiled``), and what the trace shows
of it: the compile ids of the regions that ran (``Torch-Compiled Region: 0/1`` is frame 0's
first recompile, running). A trace without the run's record says which signal is missing.

Neither a graph break nor a recompile has a transformation in the what-if model: what one
costs is the eager code between the graphs and the lost fusion (a break), or compile time and
a cache that may fill (a recompile). They claim no predicted gain; their fix is measured by
``proflab compare`` of the runs before and after. A CUDA graph skip does: the regions it left
eager-launched are replayed as ``mode="reduce-overhead"`` would have replayed them.
"""

from __future__ import annotations

from proflab.analysis.context import Context
from proflab.model import Trace
from proflab.model.findings import Finding, Fix
from proflab.rules._common import keep, predicted

__all__ = ["graph_breaks", "recompiles", "cudagraph_skipped"]

_NO_GAIN = ("no gain is predicted: what it costs is the eager code between the graphs and the fusion lost across "
            "them; make the change and measure it (proflab compare)")
_RECOMPILE_COST = _NO_GAIN.replace("the eager code between the graphs and the fusion lost across them",
                                   "compile time, and eager code once a frame hits the recompile limit")


def _none(why: str) -> dict:
    """The prediction of a finding that claims no gain: why, and how to measure its fix."""
    return {"model": "none", "why": why}
# Dynamo gives up on a frame after this many compiles of it (torch._dynamo.config.recompile_limit;
# 8 in the torch versions proflab supports): the frame then runs eager for the rest of the process
_RECOMPILE_LIMIT = 8


def _record(ctx: Context) -> dict | None:
    rec = ctx.compiled.record
    return rec if isinstance(rec, dict) and "missing" not in rec else None


def _no_record(ctx: Context, what: str) -> None:
    if ctx.compiled.compiled:
        ctx.note_missing("torch.compile's record", "the trace ran compiled code but carries no record of what Dynamo "
                         "did (graph breaks, recompiles, CUDA graph skips): proflab run records it", what)


def graph_breaks(trace: Trace, ctx: Context) -> list[Finding]:
    """Graph breaks, as Dynamo counted them, with their reasons and lines."""
    rec = _record(ctx)
    if rec is None:
        _no_record(ctx, "graph breaks")
        return []
    n = int(rec.get("graph_break_count") or 0)
    if n == 0:
        return []
    breaks = rec.get("graph_breaks") or []
    regions_per_step = ctx.compiled.per_step(ctx.compiled.regions)
    # a break in code that runs every step splits every step's graph: worth a warning
    hot = bool(regions_per_step and regions_per_step > 1)
    top = breaks[0] if breaks else {}
    lines = [line for b in breaks for line in b.get("lines") or []]
    return [Finding(
        id="graph_breaks",
        category="graph_breaks",
        severity="warning" if hot else "info",
        title=f"torch.compile broke its graph {n} time{'s' if n != 1 else ''}"
        + (f", mostly: {top['reason']}" if top.get("reason") else "")
        + (f" ({regions_per_step:g} compiled regions a step)" if regions_per_step else ""),
        evidence={
            "graph_breaks": n,
            "reasons": [{"reason": b.get("reason"), "count": b.get("count"), "lines": b.get("lines") or []} for b in breaks],
            "compiled_regions_per_step": regions_per_step,
            "unique_graphs": rec.get("unique_graphs"),
        },
        est_gain_ms=0.0,
        est_gain_pct=0.0,
        fix="Remove what breaks the graph at the lines listed (a .item() or print on a tensor, data-dependent "
        "Python control flow, an unsupported call): keep values on the GPU, use torch.cond or torch.where, or move "
        "the call out of the compiled function; torch._dynamo.explain(fn)(*args) lists each break. "
        "fullgraph=True makes a break an error.",
        where={"lines": lines[:10]},
        prediction=_none(_NO_GAIN),
    )]


def recompiles(trace: Trace, ctx: Context) -> list[Finding]:
    """Frames compiled more than once: Dynamo's record (the guard that failed), else the
    compile ids of the regions the trace shows running."""
    rec = _record(ctx)
    seen = ctx.compiled.recompiled_frames
    if rec is None:
        _no_record(ctx, "recompile reasons")
        if not seen:
            return []
        ids = sorted({i for v in seen.values() for i in v})
        return [Finding(
            id="recompiles", category="recompiles", severity="info",
            title=f"Compiled frames ran under later compile ids ({', '.join(ids)}): they were recompiled",
            evidence={"compile_ids_running": ids, "recompile_reasons": "missing: the trace carries no record of them"},
            est_gain_ms=0.0, est_gain_pct=0.0,
            fix="Find why with TORCH_LOGS=recompiles (or profile with proflab run, which records the reasons): mark "
            "changing sizes dynamic (torch._dynamo.mark_dynamic) or keep them fixed (pad the last batch).",
            where={"compile_ids": ids}, prediction=_none(_RECOMPILE_COST),
        )]
    n = int(rec.get("recompile_count") or 0)
    if n == 0:
        return []
    reasons = rec.get("recompiles") or []
    compiles = rec.get("compiles") or []
    recompiled_ids = {r.get("compile_id") for r in reasons}
    spent_s = sum(float(c.get("compile_s") or 0) for c in compiles if c.get("compile_id") in recompiled_ids)
    per_frame: dict[str, int] = {}
    for c in compiles:
        per_frame[c.get("frame")] = per_frame.get(c.get("frame"), 0) + 1
    at_limit = sorted(f for f, k in per_frame.items() if k >= _RECOMPILE_LIMIT)
    return [Finding(
        id="recompiles",
        category="recompiles",
        severity="critical" if at_limit else "warning",
        title=f"torch.compile recompiled {n} time{'s' if n != 1 else ''}"
        + (f" ({spent_s:.1f} s of compiling)" if spent_s else "")
        + (f", mostly: {reasons[0]['reason']}" if reasons and reasons[0].get("reason") else "")
        + ("; frames at the recompile limit run eager from then on" if at_limit else ""),
        evidence={
            "recompiles": n,
            "recompile_compile_s": round(spent_s, 3),
            "reasons": reasons,
            "compiles_per_frame": per_frame,
            "frames_at_recompile_limit": at_limit,
        },
        est_gain_ms=0.0,
        est_gain_pct=0.0,
        fix="Each reason names the guard that failed: a size that changes (mark it dynamic with "
        "torch._dynamo.mark_dynamic, compile with dynamic=True, or pad to fixed sizes), a Python value that changes "
        "(pass it as a tensor), or a mode switch (train/eval: compile each once).",
        where={"frames": sorted(per_frame)[:10]},
        prediction=_none(_RECOMPILE_COST),
    )]


def cudagraph_skipped(trace: Trace, ctx: Context) -> list[Finding]:
    """CUDA graphs that ``mode="reduce-overhead"`` skipped, with Inductor's reason: those
    regions launch every kernel, which the replay prices."""
    rec = _record(ctx)
    if rec is None:
        return []
    n = int(rec.get("cudagraph_skip_count") or 0)
    if n == 0:
        return []
    skips = rec.get("cudagraph_skips") or []
    f = Finding(
        id="cudagraph_skipped",
        category="cudagraph_skipped",
        severity="warning",
        title=f"CUDA graphs skipped {n} time{'s' if n != 1 else ''}"
        + (f": {skips[0]['reason']}" if skips and skips[0].get("reason") else "")
        + "; those compiled regions launch every kernel",
        evidence={"cudagraph_skips": n, "reasons": skips,
                  "launches_in_regions_per_step": ctx.compiled.per_step(ctx.compiled.launches["in_regions"])},
        est_gain_ms=0.0,
        est_gain_pct=0.0,
        fix="Remove the reason Inductor gives: keep the region's inputs on the GPU (no CPU tensors), avoid "
        "mutating inputs inside it, fix dynamic sizes, and call torch.compiler.cudagraph_mark_step_begin() "
        "before each step where outputs are kept across steps.",
        where={"frames": sorted({s.get("frame") for s in skips if s.get("frame")})},
        assumption="the regions replay from CUDA graphs, as mode='reduce-overhead' replays them",
    )
    if ctx.compiled.launches["in_regions"] == 0:
        return [f]
    f = predicted(f, ctx, Fix("cuda_graph", target="regions", label="the skipped CUDA graphs captured"))
    return keep(f, ctx) or [f]

