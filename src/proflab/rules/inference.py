"""LLM inference: a generation loop's own problems (``kv_cache_recompute``, ``padding_waste``,
and the timeline categories ``launch_bound``, ``sync_bound`` and ``memory_bound`` where the
phase is decode: ``where={"phase": ["decode"]}``).

Their evidence is the loop as ``analysis.timeline.inference`` finds it: the forwards, their
phases, shapes and token intervals. Each says how its gain was predicted:

- recomputed context: each decode forward that re-ran the whole context is predicted as a cached
  one from its own shapes and times (``inference.recompute_cost``: the time that scales with the
  work shrinks by the FLOP ratio; on a GPU a forward takes the longer of its unprofiled host time
  and its GPU time, so a host that outlasts the GPU hides the recomputation). Claimed only where the
  low end of the saving is material: at small contexts, or behind a slow host, recomputing can cost
  nothing measurable, and then nothing is claimed (the missing-signal note gives the range);
- launch-bound decode: the what-if model's ``cuda_graph`` (what CUDA graphs, or a static cache
  with ``torch.compile(mode="reduce-overhead")``, do to the decode step's launches);
- a per-token host sync: the what-if model's ``remove_syncs``;
- memory-bound decode far from the roof: no gain is predicted;
- padding waste: not measurable from a trace (the mask's values are not in it); whether the batch
  is padded is said with the missing signal, and no finding is made.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from proflab.analysis.context import Context
from proflab.analysis.timeline.inference import recompute_cost
from proflab.model import Trace
from proflab.model.findings import Finding, Fix
from proflab.rules._common import MIN_GAIN_PCT, pct, predicted, severity

__all__ = ["kv_cache_recompute", "decode_launch_bound", "per_token_sync", "decode_far_from_roof", "padding_waste"]

_DECODE = {"phase": ["decode"]}
# decode's GPU busy below this share of the token interval: the host, not the GPU, sets the pace
_LAUNCH_BUSY_PCT = 50.0
# decode's model bandwidth utilisation below this (with the GPU busy): far from the memory roof
_FAR_MBU_PCT = 50.0


def _none(why: str) -> dict:
    return {"model": "none", "why": why}


def kv_cache_recompute(trace: Trace, ctx: Context) -> list[Finding]:
    """Decode forwards that recompute the whole context (no KV cache), where it costs time."""
    inf = ctx.inference
    if not inf.found:
        return []
    cost = recompute_cost(inf)
    if cost is None:
        return []
    total_ms = float(inf.forwards["interval_ms"].sum())
    gain_pct = pct(cost["gain_ms"], total_ms, 2)
    if gain_pct < MIN_GAIN_PCT:
        # said in the evidence of nothing: recomputing is as fast as caching would be here
        hidden = cost.get("gain_range_ms")
        why = ("the host outlasts the GPU's work in them, which hides it: a cache is predicted to save "
               f"{hidden[0]:.2f}-{hidden[1]:.2f} ms over the generation (the range: the profiler's cost per event "
               "taken off the host time; a cache's own host work is not in it); a bare run with the cache measures it"
               if hidden else "the work that scales with it takes little of their time")
        ctx.note_missing("recompute cost", f"{cost['forwards']} decode forwards recomputed their context "
                         f"({cost['context_min']}-{cost['context_max']} tokens), but {why}: no saving from a KV cache "
                         "is claimed at these contexts", "kv_cache_recompute")
        return []
    lat = inf.latency
    return [Finding(
        id="kv_cache_recompute",
        category="kv_cache_recompute",
        severity=severity(gain_pct),
        title=f"Every decode step re-runs the whole context (no KV cache): {cost['forwards']} forwards of "
        f"{cost['context_min']}-{cost['context_max']} tokens where one would do; a cache is predicted to save "
        f"{cost['gain_ms']:.3g} of their {cost['measured_ms']:.3g} ms",
        evidence={**cost, "tpot_ms": lat.get("tpot_ms"), "generation_ms": round(total_ms, 3),
                  "recomputed_forwards": int(inf.forwards["recompute"].sum())},
        est_gain_ms=cost["gain_ms"],
        est_gain_pct=gain_pct,
        fix="Keep the key/value cache: generate(..., use_cache=True) (Hugging Face), or pass past_key_values "
        "and only the new token to each forward in a hand-written loop; a static cache "
        "(cache_implementation='static') keeps the shapes fixed for torch.compile and CUDA graphs.",
        where={**_DECODE, "forwards": inf.forwards.filter(pl.col("recompute"))["index"].head(10).to_list()},
        assumption="a cached decode forward does 1/q_len of the GEMM work and one query row of attention; the time "
        "that scales with that work shrinks with it (not below reading the weights once), the rest stays",
        prediction={"model": "work ratio", "per": "generation", "basis": cost["time_basis"],
                    **({"predicted_gain_range_ms": cost["gain_range_ms"]} if "gain_range_ms" in cost else {})},
    )]


def _decode(ctx: Context) -> pl.DataFrame | None:
    inf = ctx.inference
    if not inf.found:
        return None
    d = inf.forwards.filter((pl.col("phase") == "decode") & ~pl.col("recompute"))
    return d if d.height else None


def decode_launch_bound(trace: Trace, ctx: Context) -> list[Finding]:
    """Decode steps whose GPU time is a small share of the token interval while the host launches."""
    d = _decode(ctx)
    if d is None or not trace.has_gpu:
        return []
    if d["gpu_ms"].null_count() == d.height:
        ctx.note_missing("decode GPU time", "the kernels are not linked to their launches", "decode_launch_bound")
        return []
    interval, gpu = float(d["interval_ms"].sum()), float(d["gpu_ms"].fill_null(0).sum())
    busy = pct(gpu, interval)
    if busy >= _LAUNCH_BUSY_PCT or ctx.compiled.graphed:
        return []
    idle_ms = interval - gpu
    whole = float(ctx.inference.forwards["interval_ms"].sum())
    f = Finding(
        id="decode_launch_bound",
        category="launch_bound",
        severity=severity(pct(idle_ms, whole)),
        title=f"Decode is launch-bound: the GPU is busy {busy:g}% of each token's {d['interval_ms'].median():.3g} ms",
        evidence={"decode_forwards": d.height, "gpu_busy_pct": busy, "gpu_ms_per_forward": round(gpu / d.height, 4),
                  "interval_ms_median": round(float(d["interval_ms"].median()), 4), "idle_ms": round(idle_ms, 3)},
        est_gain_ms=idle_ms,
        est_gain_pct=pct(idle_ms, whole, 2),
        fix="Replay the decode step from a CUDA graph: a static KV cache with torch.compile(mode='reduce-overhead') "
        "(Hugging Face: cache_implementation='static'), or CUDA graphs in the serving engine (vLLM and TensorRT-LLM "
        "capture decode by default; do not run them eager).",
        where=_DECODE,
        assumption="the decode step's launches are replayed from one CUDA graph",
        overlaps=("launch_bound",),
    )
    return [predicted(f, ctx, Fix("cuda_graph", label="decode in a CUDA graph"))]


def per_token_sync(trace: Trace, ctx: Context) -> list[Finding]:
    """The host waits for the GPU once or more every decode token (sampling's ``.item()``, an EOS check)."""
    d = _decode(ctx)
    if d is None or not trace.has_gpu:
        return []
    b = ctx.blocking
    if b.height == 0:
        return []
    # a sync inside a decode forward's span (its start to its token), per forward
    t = b["sync_start_ns"].to_numpy()
    s, e = d["start_ns"].to_numpy(), d["end_ns"].to_numpy()
    i = np.searchsorted(s, t, side="right") - 1
    inside = (i >= 0) & (t < e[np.clip(i, 0, None)])
    per = np.bincount(i[inside], minlength=len(s)) if inside.any() else np.zeros(len(s), int)
    if len(per) == 0 or np.median(per) < 1:
        return []
    syncs = b.filter(pl.Series(inside))
    names = syncs.group_by("sync_name").len().sort("len", descending=True)
    wait_ms = float(((syncs["sync_end_ns"] - syncs["sync_start_ns"]).sum() or 0) / 1e6)
    # what the syncs cost is the GPU's idle after them (the host relaunching), not the wait itself
    g = ctx.gaps.filter(pl.col("cause") == "sync")
    gs = g["start_ns"].to_numpy()
    j = np.searchsorted(s, gs, side="right") - 1
    in_decode = (j >= 0) & (gs < e[np.clip(j, 0, None)])
    idle_ms = float(g["dur_ns"].to_numpy()[in_decode].sum() / 1e6)
    whole = float(ctx.inference.forwards["interval_ms"].sum())
    f = Finding(
        id="per_token_sync",
        category="sync_bound",
        severity=severity(pct(idle_ms, whole)),
        title=f"The host waits for the GPU {float(np.median(per)):g} time(s) every decode token "
        f"({names['sync_name'][0]}): the next token's launches cannot start before the last one's GPU work ends",
        evidence={"syncs_per_token_median": float(np.median(per)), "sync_wait_ms": round(wait_ms, 3),
                  "idle_after_sync_ms": round(idle_ms, 3),
                  "calls": dict(zip(names["sync_name"].to_list(), names["len"].to_list()))},
        est_gain_ms=idle_ms,
        est_gain_pct=pct(idle_ms, whole, 2),
        fix="Keep the sampled token on the GPU: feed it to the next forward as a tensor, check EOS on the GPU "
        "(torch.where over a finished mask) and read it back every N tokens or asynchronously (non_blocking copy to "
        "pinned memory and an event); avoid .item(), .tolist() and Python conditions on GPU tensors per token.",
        where={**_DECODE, "ops": names["sync_name"].head(5).to_list()},
        assumption="the per-token syncs stop waiting; the host's launches then run ahead of the GPU",
        overlaps=("sync_bound",),
    )
    return [predicted(f, ctx, Fix("remove_syncs", target="|".join(names["sync_name"].to_list()), label="no per-token sync"))]


def decode_far_from_roof(trace: Trace, ctx: Context) -> list[Finding]:
    """Decode keeps the GPU busy yet reads its bytes far below the HBM peak (low MBU)."""
    d = _decode(ctx)
    dec = ctx.inference.utilisation.get("decode") or {}
    if d is None or dec.get("mbu_pct") is None:
        return []
    busy = dec.get("gpu_busy_pct")
    if busy is None or busy < _LAUNCH_BUSY_PCT or dec["mbu_pct"] >= _FAR_MBU_PCT:
        return []
    return [Finding(
        id="decode_far_from_roof",
        category="memory_bound",
        severity="info" if dec["mbu_pct"] >= 25 else "warning",
        title=f"Decode reads its weights and KV cache at {dec['achieved_gbps']:g} GB/s, {dec['mbu_pct']:g}% of the "
        f"{dec['hbm_peak_gbps']:g} GB/s peak (MBU), with the GPU busy {busy:g}% of each token",
        evidence=dec,
        est_gain_ms=0.0,
        est_gain_pct=0.0,
        fix="Decode is bound by reading the weights once per token: batch more sequences per forward (the weights are "
        "read once for all), quantise the weights (int8/fp8/int4 halve or quarter the bytes), and check the hot "
        "kernels (proflab kernels) for GEMV kernels far from the memory roof; a fused attention kernel for the KV reads.",
        where=_DECODE,
        prediction=_none("no gain is predicted: what a larger batch or quantisation saves depends on the kernels that "
                         "replace these; make the change and measure it (proflab compare)"),
    )]


def padding_waste(trace: Trace, ctx: Context) -> list[Finding]:
    """Pad tokens computed as if real. A trace records shapes, not values: how many positions of a
    padded batch are padding (the attention mask's values), and which sequences finished (EOS)
    while the batch computed on, are not in it, so no waste is measured and no gain claimed. What
    the shapes do say is recorded with the missing signal: whether the attention took a mask
    (Hugging Face passes one to SDPA only where a position is masked: the batch is padded) or none
    (no position masked: no padded prompt)."""
    inf = ctx.inference
    if not inf.found or (inf.latency.get("batch") or 1) <= 1:
        return []
    mask = inf.forwards["att_mask"]
    n, masked = inf.forwards.height, int(mask.fill_null(False).sum())
    if masked:
        said = (f"the attention took a mask tensor in {masked} of {n} forwards: the batch is padded, but how many "
                "positions are padding is in the mask's values, which a trace does not hold (nor which sequences "
                "finished at EOS while the batch computed on): padding waste cannot be measured from it")
    elif mask.null_count() == n:
        said = ("a trace records the batch's padded shapes, not which positions are padding (the attention mask's "
                "values): padding waste cannot be measured from it")
    else:
        said = (f"the attention took no mask in any of {n} forwards: no prompt position is masked (no left or right "
                "padding); sequences that finished at EOS while the batch computed on are not in the shapes: "
                "that waste cannot be measured from it")
    ctx.note_missing("pad tokens", said, "padding_waste")
    return []
