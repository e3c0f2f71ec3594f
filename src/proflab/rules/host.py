"""Idle GPU time the host caused: synchronisation, launch overhead, and host-side work.

All three read the classified idle gaps (``analysis.gaps``). The estimated gain of each is
the idle time of its gaps on the worst device: what the GPU would gain if the host kept the
queue full, an upper bound that assumes the host work itself fits under the GPU work.
"""

from __future__ import annotations

import polars as pl

from proflab.analysis.context import Context
from proflab.analysis.intervals import IntervalSet
from proflab.analysis.threads import ThreadClock
from proflab.model import Trace
from proflab.report import Finding
from proflab.rules._common import MIN_GAIN_PCT, gain_finding, ms, pct, us

__all__ = ["sync_bound", "launch_bound", "host_bound", "sync_copy_apis"]

_SKIP = ("GPU idle-gap causes",)


def _gaps_of(trace: Trace, ctx: Context, cause: str) -> tuple[pl.DataFrame, int] | None:
    """Gaps of one cause on the device where they cost most, and their total (ns)."""
    if not trace.has_gpu:
        return None
    if not ctx.has_launch_links:
        ctx.note_missing(
            "host launch calls",
            "the trace has no CUDA runtime/driver events with correlation ids, so idle gaps "
            "cannot be tied to what the host was doing",
            *_SKIP,
        )
        return None
    g = ctx.gaps.filter(pl.col("cause") == cause)
    if g.height == 0:
        return None
    per_dev = g.group_by("device").agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True)
    device = per_dev["device"][0]
    g = g.filter(pl.col("device") == device)
    total = int(per_dev["dur_ns"][0])
    if pct(total, ctx.wall_ns, 3) < MIN_GAIN_PCT:
        return None
    return g, total


def _steps(g: pl.DataFrame) -> list[int]:
    return sorted(int(s) for s in g["step"].drop_nulls().unique())


def _idle_pct_of_busy(ctx: Context, device: int) -> float:
    b = ctx.device_breakdowns.get(device)
    return round(b.busy_pct, 1) if b else 0.0


def sync_bound(trace: Trace, ctx: Context) -> list[Finding]:
    found = _gaps_of(trace, ctx, "sync")
    if not found:
        return []
    g, total = found
    device = int(g["device"][0])
    ops = (
        trace.cpu.select("cat", "external_id", "name")
        .filter(pl.col("cat") == "cpu_op")
        .select(pl.col("external_id").alias("sync_external_id"), pl.col("name").alias("op"))
        .unique("sync_external_id", keep="first")
    )
    by_call = (
        g.join(ops, on="sync_external_id", how="left")
        .group_by("sync_name", "op")
        .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("idle_ns"))
        .sort("idle_ns", descending=True)
    )
    lines = ctx.frames.top_lines(g.select("tid", pl.col("start_ns").alias("t_ns")))
    per_step = g.group_by("step").len()["len"].median() if g["step"].drop_nulls().len() else None
    evidence = {
        "sync_idle_ms": ms(total),
        "sync_gaps": g.height,
        "syncs_per_step": per_step,
        "median_gap_us": us(g["dur_ns"].median()),
        "idle_pct_of_window": pct(total, ctx.wall_ns),
        "gpu_busy_pct": _idle_pct_of_busy(ctx, device),
        "calls": [
            {"call": r["sync_name"], "op": r["op"], "count": r["count"], "idle_ms": ms(r["idle_ns"])}
            for r in by_call.head(5).iter_rows(named=True)
        ],
    }
    top = by_call.row(0, named=True)
    what = f"{top['op']} ({top['sync_name']})" if top["op"] else top["sync_name"]
    return [
        gain_finding(
            "sync_bound",
            total,
            ctx.wall_ns,
            title=f"Host synchronisation drains the GPU: {g.height} syncs leave it idle {ms(total, 2)} ms "
            f"({pct(total, ctx.wall_ns)}% of the window); top: {what}",
            evidence=evidence,
            fix=(
                "Remove host synchronisation from the hot loop: no .item(), .cpu(), .tolist(), print(tensor) "
                "or tensor-valued `if` per step; keep running sums on the GPU and read them every N steps; "
                "use non_blocking=True copies into pinned buffers; drop torch.cuda.synchronize() outside timing code."
            ),
            where={"steps": _steps(g), "ops": [o for o in by_call["op"].drop_nulls().unique(maintain_order=True).head(5)], "lines": lines},
            assumption="without the syncs the host runs ahead and keeps the GPU queue full, hiding these gaps",
        )
    ]


def launch_bound(trace: Trace, ctx: Context) -> list[Finding]:
    found = _gaps_of(trace, ctx, "launch")
    if not found:
        return []
    g, total = found
    device = int(g["device"][0])
    ls = ctx.launch_stats
    short_ops = (
        ctx.kernel_rows.filter(pl.col("dur_ns") < 10_000)
        .group_by("op")
        .agg(pl.len().alias("n"))
        .drop_nulls("op")
        .sort("n", descending=True)
        .head(5)
    )
    lines = ctx.frames.top_lines(g.select("tid", pl.col("end_ns").alias("t_ns")))
    evidence = {
        "launch_idle_ms": ms(total),
        "short_gaps": g.height,
        "median_gap_us": us(g["dur_ns"].median()),
        "idle_pct_of_window": pct(total, ctx.wall_ns),
        "gpu_busy_pct": _idle_pct_of_busy(ctx, device),
        "kernels": ls.kernel_count,
        "median_kernel_us": us(ls.median_kernel_ns),
        "kernels_under_5us_pct": None if ls.short_kernel_pct is None else round(ls.short_kernel_pct, 1),
        "launches_per_step": ls.launches_per_step,
        "median_launch_call_us": us(ls.median_launch_call_ns),
        "median_launch_to_start_us": us(ls.median_delay_ns),
    }
    return [
        gain_finding(
            "launch_bound",
            total,
            ctx.wall_ns,
            title=f"Launch-bound: {g.height} short idle gaps between small kernels cost {ms(total, 2)} ms "
            f"({pct(total, ctx.wall_ns)}%); median kernel {us(ls.median_kernel_ns)} us",
            evidence=evidence,
            fix=(
                "Cut per-kernel launch cost: capture the step in CUDA graphs (torch.compile(mode='reduce-overhead') "
                "or torch.cuda.graphs), fuse elementwise chains with torch.compile, batch small tensors into "
                "larger ones (foreach/multi-tensor ops, fused optimizers), and avoid per-element Python loops."
            ),
            where={"steps": _steps(g), "ops": short_ops["op"].to_list(), "lines": lines},
            assumption="with launches batched or graph-captured the GPU runs these kernels back to back",
        )
    ]


def host_bound(trace: Trace, ctx: Context) -> list[Finding]:
    found = _gaps_of(trace, ctx, "host")
    if not found:
        return []
    g, total = found
    device = int(g["device"][0])
    activity = _host_activity(trace, g)
    top = activity[0]["name"] if activity else None
    loader = any("DataLoader" in a["name"] or "dataloader" in a["name"].lower() for a in activity[:3])
    if loader:
        fix = (
            "The input pipeline starves the GPU: use DataLoader(num_workers>0, pin_memory=True, "
            "persistent_workers=True, prefetch_factor=2-4), move heavy transforms into the workers or onto "
            "the GPU, and cache decoded data."
        )
    else:
        fix = (
            "Take host work off the GPU's critical path: launch the next GPU work before the CPU-heavy part "
            "(or move it to a worker thread/process), vectorise Python loops, and use torch.compile / CUDA graphs "
            "to cut Python overhead."
        )
    lines = ctx.frames.top_lines(g.select("tid", pl.col("start_ns").alias("t_ns")))
    evidence = {
        "host_idle_ms": ms(total),
        "gaps": g.height,
        "median_gap_ms": ms(g["dur_ns"].median()),
        "max_gap_ms": ms(g["dur_ns"].max()),
        "idle_pct_of_window": pct(total, ctx.wall_ns),
        "gpu_busy_pct": _idle_pct_of_busy(ctx, device),
        "host_activity_in_gaps": activity[:5],
    }
    title = (
        f"Host-bound: the GPU waits {ms(total, 2)} ms ({pct(total, ctx.wall_ns)}%) in {g.height} gaps "
        f"while the host works" + (f", mostly in {top}" if top else "")
    )
    return [
        gain_finding(
            "host_bound",
            total,
            ctx.wall_ns,
            title=title,
            evidence=evidence,
            fix=fix,
            where={"steps": _steps(g), "ops": [a["name"] for a in activity[:5]], "lines": lines},
            assumption="the host work moves off the critical path (workers, prefetch), closing these gaps",
        )
    ]


def _host_activity(trace: Trace, g: pl.DataFrame) -> list[dict]:
    """What the launching thread was inside during the gaps: names by overlapped time."""
    gaps = g.filter(pl.col("tid").is_not_null()).select(
        "tid", pl.col("start_ns").alias("g0"), pl.col("launch_start_ns").alias("g1")
    )
    if gaps.height == 0:
        return []
    events = (
        trace.cpu.select("cat", "tid", "name", "start_ns", "dur_ns")
        .filter(
            pl.col("cat").is_in(["cpu_op", "user_annotation"])
            & ~pl.col("name").str.starts_with("ProfilerStep#")
            & pl.col("tid").is_in(gaps["tid"].unique().implode())
        )
        .select(pl.col("tid").alias("etid"), "name", pl.col("start_ns").alias("e0"), (pl.col("start_ns") + pl.col("dur_ns")).alias("e1"))
    )
    # Each event's overlap with the gaps of its thread is one prefix-sum lookup: the gap
    # windows, keyed per thread (ThreadClock), form one IntervalSet, and an event [e0, e1)
    # overlaps them by covered(e1) - covered(e0). Linear in gaps + events; a pairing of
    # gaps with events would keep gaps x long ranges (a `## backward ##` range spans
    # thousands of gaps on one thread).
    clock = ThreadClock([gaps["tid"], events["etid"]], [gaps["g0"], gaps["g1"], events["e0"], events["e1"]])
    windows = IntervalSet.from_spans(clock.key(gaps["tid"], gaps["g0"]), clock.key(gaps["tid"], gaps["g1"]))
    ov = windows.covered_within(clock.key(events["etid"], events["e0"]), clock.key(events["etid"], events["e1"]))
    total = windows.total_ns or 1
    agg = (
        events.select("name")
        .with_columns(pl.Series("ov", ov, dtype=pl.Int64))
        .filter(pl.col("ov") > 0)
        .group_by("name")
        .agg(pl.col("ov").sum().alias("ov_ns"))
        .sort(["ov_ns", "name"], descending=[True, False])
        .head(8)
    )
    return [
        {"name": r["name"], "overlap_ms": ms(r["ov_ns"]), "pct_of_gap_time": pct(r["ov_ns"], total)}
        for r in agg.iter_rows(named=True)
    ]


_SYNC_COPY_API = r"^(?:cudaMemcpy|cudaMemcpy[23]D|cudaMemcpyToSymbol|cudaMemcpyFromSymbol|cudaMemset|cudaMemset[23]D|cuMemcpy(?:DtoH|HtoD|DtoD|HtoA|AtoH)?|cuMemsetD\d+|hipMemcpy(?:WithStream|DtoH|HtoD|DtoD|2D|3D)?|hipMemset(?:D\d+|2D|3D)?)$"


def sync_copy_apis(trace: Trace, ctx: Context) -> list[Finding]:
    """Synchronous copy/memset APIs (cudaMemcpy, cudaMemset...): each blocks the host until the
    GPU is done. Reported by count and blocked host time; the GPU idle they cause, if any, is
    already in the sync_bound finding, so this one claims no gain of its own."""
    calls = trace.cpu.filter(pl.col("cat").is_in(["cuda_runtime", "cuda_driver"]) & pl.col("name").str.contains(_SYNC_COPY_API))
    if calls.height == 0:
        return []
    by_api = calls.group_by("name").agg(pl.len().alias("calls"), pl.col("dur_ns").sum().alias("host_ns")).sort("host_ns", descending=True)
    idle = ctx.gaps.filter(pl.col("sync_name").is_in(by_api["name"].implode()))["dur_ns"].sum() if trace.has_gpu else 0
    lines = ctx.frames.top_lines(calls.select("tid", pl.col("start_ns").alias("t_ns")))
    return [
        gain_finding(
            "sync_bound",
            0,
            ctx.wall_ns,
            id="sync_copy_apis",
            title=(
                f"Synchronous copy/memset APIs: {calls.height} calls ({', '.join(by_api['name'].head(3).to_list())}) "
                f"block the host for {ms(by_api['host_ns'].sum(), 2)} ms"
            ),
            evidence={
                "apis": [{"api": r["name"], "calls": r["calls"], "host_blocked_ms": ms(r["host_ns"])} for r in by_api.iter_rows(named=True)],
                "gpu_idle_after_them_ms": ms(idle),
            },
            fix=(
                "Use the async forms on a stream (cudaMemcpyAsync/cudaMemsetAsync; in PyTorch .to(device, non_blocking=True) "
                "from pinned memory, torch.zeros/fill_ on the GPU) and synchronise once where the result is needed."
            ),
            where={"ops": by_api["name"].head(5).to_list(), "lines": lines},
            assumption="the GPU idle they cause is counted in sync_bound; this finding claims no separate gain",
        )
    ]
