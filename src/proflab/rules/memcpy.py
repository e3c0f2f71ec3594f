"""Host<->device copies: pageable memory, and copy time the GPU cannot hide.

Gains are split so the two findings never count the same time twice: ``pageable_memcpy``
claims what pinning would save (copy time down to the pinned rate); ``memcpy_bound`` claims
the exposed copy time that would remain after that.
"""

from __future__ import annotations

import polars as pl

from proflab.analysis.timeline.calls import IS_CALL, call_names
from proflab.analysis.context import Context
from proflab.analysis.timeline.memcpy import copies, has_copies, pageable_host_copies
from proflab.model import Trace
from proflab.model.findings import Finding, Fix
from proflab.analysis.timeline.memcpy import reference_link
from proflab.rules._common import MIN_GAIN_PCT, gain_finding, keep, ms, pct, predicted, with_try

__all__ = ["pageable_memcpy", "memcpy_bound", "reported_without_gain"]

def _pinning(ctx: Context) -> tuple[int, list[dict]]:
    saved, rows, unsized = ctx.pinning
    if unsized:
        ctx.note_missing("memcpy bytes", "copy events carry no byte counts", "pageable copy savings")
    return saved, rows


def _async_on_pageable(trace: Trace) -> int:
    """cudaMemcpyAsync calls whose host side is pageable: the API's promise is void, the copy
    is staged and the call returns only when it is done (nsys's expert rule flags each one)."""
    calls = trace.cpu.select("cat", "name", "correlation").filter(IS_CALL & pl.col("name").is_in(call_names(trace.cpu, "Async").implode()))
    return pageable_host_copies(trace).join(calls.select("correlation"), on="correlation", how="semi").height


def pageable_memcpy(trace: Trace, ctx: Context) -> list[Finding]:
    if not trace.has_gpu or not has_copies(trace):
        return []
    saved, rows = _pinning(ctx)
    gain_pct = pct(saved, ctx.wall_ns, 2)
    async_calls = _async_on_pageable(trace)
    # Reported even when the copy time is small: an async copy from pageable memory is a
    # hidden synchronisation, whose cost shows in the sync findings instead.
    if not rows or (gain_pct < MIN_GAIN_PCT and not async_calls):
        return []
    total_bytes = sum(r["bytes"] for r in rows)
    copies = sum(r["copies"] for r in rows)
    main = max(rows, key=lambda r: r["saving_ms"] or 0)
    ops = _copy_ops(trace, pageable=True)
    h2d = [r for r in rows if r["direction"] == "HtoD"] or rows
    rate = float(h2d[0]["reference_gbps"]) if h2d else reference_link(ctx.device_info.get("compute_major"))[1]
    f = predicted(
        gain_finding(
            "pageable_memcpy",
            saved,
            ctx.wall_ns,
            title=(
                f"Pageable host memory: {copies} copies ({total_bytes / 2**20:.0f} MiB) run at "
                f"{main['achieved_gbps']} GB/s {main['direction']}, against ~{main['reference_gbps']:g} GB/s pinned "
                + ("(measured here)" if main["reference"].startswith("best") else "(PCIe reference)")
                + (f"; {async_calls} cudaMemcpyAsync calls on pageable memory run synchronously" if async_calls
                   else ", and block the host")
            ),
            evidence={
                "directions": rows,
                "pageable_copy_ms": round(sum(r["time_ms"] for r in rows), 3),
                "async_calls_made_synchronous": async_calls,
            },
            fix=(
                "Allocate host tensors in pinned memory (tensor.pin_memory(), DataLoader(pin_memory=True), "
                "torch.empty(..., pin_memory=True) staging buffers) and copy with .to('cuda', non_blocking=True) "
                "so copies run at the link rate, stop blocking the host, and can overlap compute."
            ),
            where={"ops": ops, "directions": [r["direction"] for r in rows]},
            assumption="pinned copies run at the reference rate stated per direction",
        ),
        ctx,
        Fix("pin_copies", rate_gbps=rate, label="pinned memory, non_blocking=True"),
    )
    f = with_try(f, "pin-memory")  # (the DataLoader's batches; other copies need pinned buffers in the code)
    # an async call on pageable memory is reported even where pinning saves little (it is a hidden sync)
    return [f] if async_calls else keep(f, ctx)


def reported_without_gain(f: Finding) -> bool:
    """Whether ``f`` is reported whatever its gain: pageable copies behind async calls, each
    a hidden synchronisation (``pageable_memcpy``)."""
    return f.category == "pageable_memcpy" and bool(f.evidence.get("async_calls_made_synchronous"))


def memcpy_bound(trace: Trace, ctx: Context) -> list[Finding]:
    if not trace.has_gpu or not has_copies(trace):
        return []
    breakdowns = ctx.device_breakdowns
    device, b = max(breakdowns.items(), key=lambda kv: kv[1].memcpy_ns)
    pinned_saved, _ = _pinning(ctx)
    remaining = max(b.memcpy_ns - pinned_saved, 0)
    gain_pct = pct(remaining, ctx.wall_ns, 2)
    if gain_pct < MIN_GAIN_PCT or pct(b.memcpy_ns, b.wall_ns) < 5.0:
        return []
    table = ctx.memcpy_table.filter(pl.col("copy_kind").is_not_null())
    directions = [
        {
            "direction": str(r["copy_kind"]),
            "memory": f"{r['src_kind']} -> {r['dst_kind']}",
            "copies": r["count"],
            "bytes": r["bytes"],
            "time_ms": ms(r["time_ns"]),
            "achieved_gbps": None if r["bytes"] is None else round(r["gbps"], 2),
        }
        for r in table.iter_rows(named=True)
    ]
    total_copy = int(copies(trace, "device", "dur_ns").filter(pl.col("device") == device)["dur_ns"].sum())
    # what prefetching alone saves: a pageable copy still holds the host (pinning is the other finding's fix)
    fixes = [Fix("prefetch_copies", label="copies prefetched on a side stream")]
    f = predicted(
        gain_finding(
            "memcpy_bound",
            remaining,
            ctx.wall_ns,
            title=(
                f"Copies the GPU cannot hide: {ms(b.memcpy_ns, 2)} ms of memcpy ({pct(b.memcpy_ns, b.wall_ns)}% of the "
                "window) runs with no kernel alongside"
            ),
            evidence={
                "exposed_memcpy_ms": ms(b.memcpy_ns),
                "memcpy_total_ms": ms(total_copy),
                "exposed_pct_of_window": pct(b.memcpy_ns, b.wall_ns),
                "already_claimed_by_pinning_ms": ms(pinned_saved),
                "directions": directions,
            },
            fix=(
                "Keep data on the GPU between steps (no round trips), prefetch the next batch on a side stream "
                "with pinned memory and non_blocking=True so copies overlap compute, and move fewer bytes "
                "(smaller dtypes, preprocessing on the GPU)."
            ),
            where={"ops": _copy_ops(trace, pageable=None), "directions": sorted({d["direction"] for d in directions})},
            assumption="overlapped with compute (or avoided), the exposed copy time left after pinning disappears",
        ),
        ctx,
        *fixes,
    )
    return keep(f, ctx)


def _copy_ops(trace: Trace, *, pageable: bool | None) -> list[str]:
    m = copies(trace, "src_kind", "dst_kind", "external_id", "dur_ns")
    if pageable:
        m = m.filter((pl.col("src_kind") == "Pageable") | (pl.col("dst_kind") == "Pageable"))
    ids = m.get_column("external_id").drop_nulls().unique().implode()  # only the copies' operators
    ops = trace.cpu.select("cat", "external_id", "name").filter(pl.col("external_id").is_in(ids) & (pl.col("cat") == "cpu_op"))
    ops = ops.select("external_id", pl.col("name").alias("op"))
    return (
        m.join(ops.unique("external_id"), on="external_id", how="inner")
        .group_by("op")
        .agg(pl.col("dur_ns").sum())
        .sort("dur_ns", descending=True)
        .head(5)["op"]
        .to_list()
    )
