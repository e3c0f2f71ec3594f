"""Report assembly: every analysis and rule over one analysis context, into a :class:`Report`.

``report_for(ctx)`` is what ``proflab.analyze`` returns, and what the kernel deep dive and the
job report build on for each trace.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from proflab._timings import phase
from proflab._version import __version__
from proflab.analysis.context import Context
from proflab.analysis.devices import datasheet_peaks, peaks_missing_reason
from proflab.analysis.timeline.gaps import CAUSES
from proflab.analysis.timeline.inference import replayed_latency
from proflab.model import Trace
from proflab.report import Report
from proflab.report.predicted import combined, with_overlaps
from proflab.rules import run_rules
from proflab.rules._common import ms, us

__all__ = ["report_for"]

_GPU_SKIPPED = (
    "GPU busy/idle breakdown",
    "idle-gap causes",
    "hot kernels",
    "memcpy analysis",
    "launch statistics",
    "tensor-core check",
)


def report_for(ctx: Context, *, top_kernels: int = 15) -> Report:
    """The report over an analysis context that callers may go on using (its cached tables
    are built once)."""
    trace = ctx.trace
    if not trace.has_gpu:
        ctx.note_missing(
            "GPU activity",
            "the trace has no kernel, memcpy or memset events (CPU-only profile, or CUDA activity not recorded)",
            *_GPU_SKIPPED,
        )
    with phase("timeline"):
        ranges = tuple(_ranges_beside_host_only(ctx))
        _while_little_is_held(ctx)
    with phase("rules"):
        findings = run_rules(trace, ctx)
    with phase("what-if"):
        whatif = ctx.whatif if trace.has_gpu else None
        findings = with_overlaps(findings, whatif)
        predicted = combined(findings, whatif)
    with phase("memory"):
        memory = _memory(ctx)
        if memory is not None:
            from proflab.rules.memory import memory_rules

            mem_findings = memory_rules(memory)
    if memory is not None:
        at = next((i for i, f in enumerate(findings) if f.category == "healthy"), len(findings))
        findings[at:at] = mem_findings  # no time gain: after the timeline's findings, before the verdict
    if trace.has_gpu and trace.devices.height == 0:
        ctx.note_missing("device properties", "the trace lists no deviceProperties", "datasheet peaks")
    elif trace.has_gpu and (name := (info := ctx.device_info or {}).get("name")) and datasheet_peaks(name, info.get("sm_count")) is None:
        ctx.note_missing("datasheet peaks", peaks_missing_reason(name, info.get("sm_count")), "peak-relative figures")
    if trace.steps.height == 0:
        ctx.note_missing("profiler steps", "no ProfilerStep#N ranges (prof.step() not called)", "per-step breakdown")
    elif trace.steps.height == 1 and trace.has_gpu and ctx.part_digest is None:  # (a part of a longer trace: not one step)
        _one_step(ctx)
    with phase("timeline"):  # (the tables the rules did not ask for: the summary, the FLOPs, the report's rows)
        summary = _summary(ctx)
        compiled = ctx.compiled
        if compiled.compiled or compiled.graphed:  # what torch.compile and CUDA graphs did (analysis.timeline.compiled)
            summary["compiled"] = compiled.to_dict()
            for why in compiled.missing:
                ctx.note_missing("compiled regions", why, "the split of compiled and eager work")
        inference = ctx.inference
        if inference.found:  # a generation loop's tokens, phases and bandwidth (analysis.timeline.inference)
            summary["inference"] = inference.to_dict()
            lat = summary["inference"]["latency"]
            if inference.tokens_as_steps and whatif is not None and whatif.available and "unprofiled_tpot_ms" in lat:
                # the unprofiled latency from the what-if replay's bare tokens: the report's one bare step
                lat.update(replayed_latency(inference, whatif.bare_step_times(), whatif.per_event_cost_us))
            for why in inference.missing:
                ctx.note_missing("inference signals", why, "the inference figures it names")
        perf = _perf(ctx)
        summary["gain_per"] = "step" if summary.get("step_count") else "window"
        if predicted is not None:
            summary["predicted"] = predicted
        elif whatif is not None and not whatif.available:
            summary["predicted"] = {"missing": whatif.why_not}
        _one_bare_step(summary, findings)
        return Report(
            source=_source(trace),
            device=_device(ctx),
            summary=summary,
            findings=tuple(findings),
            kernels=tuple(_kernels(ctx, top_kernels)),
            steps=tuple(_steps(ctx)),
            memcpy=tuple(_memcpy(ctx)),
            launch=_launch(ctx),
            idle=_idle(ctx),
            host_ops=tuple(_host_ops(trace)),
            ranges=ranges,
            missing=ctx.missing,
            notes=trace.meta.notes,
            memory=None if memory is None else {**memory.to_dict(), "findings": [f.id for f in mem_findings]},
            perf=None if perf is None else perf.to_dict(),
        )


def _one_step(ctx) -> None:
    """A trace of one profiled step: its GPU-side window starts at its first kernel, so what the
    GPU waited for before it (the batch, the host) is in no step; said where the host's step is
    much longer than the GPU's window."""
    g = ctx.gpu_steps
    if g.height == 0:
        return
    gpu_ms, host_ms = float(g["dur_ns"].max()) / 1e6, float(g["cpu_dur_ns"].max()) / 1e6
    if host_ms > 1.5 * gpu_ms:
        ctx.note_missing("the wait before the step's first kernel",
                         f"one profiled step: its GPU-side window ({gpu_ms:.3f} ms) starts at its first kernel, and the "
                         f"host's step took {host_ms:.3f} ms; what the GPU waited for before that kernel (a batch, the "
                         "host's own work) is in no step. Record three steps or more (proflab run --active 3)",
                         "host-side stalls before the step")


def _one_bare_step(summary: dict[str, Any], findings: list) -> None:
    """Every number of a report reads one unprofiled step. Where it was estimated, the
    observer's range and the what-if's replayed bare step (which the predictions start from:
    it keeps what serialises the step, a sync's drain, that the observer's range leaves out)
    can differ: the header then states the range both span, and never a step shorter than its
    GPU work."""
    o = summary.get("observer")
    if not o or o.get("source") != "estimated":
        return
    bare = [p["bare_step_ms"] for f in findings if isinstance(p := f.prediction, dict) and p.get("model") == "replay"
            and isinstance(p.get("bare_step_ms"), (int, float))]
    if isinstance(summary.get("predicted"), dict) and isinstance(summary["predicted"].get("bare_step_ms"), (int, float)):
        bare.append(summary["predicted"]["bare_step_ms"])
    lo, hi = o["unprofiled_step_ms"]
    work = o.get("gpu_work_ms") or 0.0
    new = [round(max(min([lo, *bare]), work), 3), round(max([hi, *bare, work]), 3)]
    if new != [lo, hi]:
        o["unprofiled_step_ms"] = new
        o["replayed_bare_step_ms"] = sorted({round(b, 3) for b in bare})


def _perf(ctx: Context):
    """Where the FLOPs go (``analysis.perf``), with the FLOPs ``proflab run`` counted for an
    unprofiled step where the trace comes from a run directory; None for a trace with no
    operators (an Nsight Systems export of a CUDA program). A part of a trace analysed in
    parts leaves it in its digest, for the combined report."""
    from proflab.analysis.perf import counted_from, perf_for
    from proflab.readers.rundir import step_flops_of

    trace = ctx.trace
    # (asked of the column: the operators copied whole to be counted held 180 MiB more at the
    # 1 GB realistic trace's peak)
    if not trace.cpu.height or not (trace.cpu.get_column("cat") == "cpu_op").any():
        ctx.note_missing("operators", "the trace records no framework operators", "where the FLOPs go (perf)")
        return None
    counted = counted_from(step_flops_of(trace.meta.source)) if trace.meta.source else None
    p = perf_for(ctx, counted=counted)
    if p.flop_source is None and trace.has_gpu:
        ctx.note_missing("input shapes", "the trace has no input shapes (record_shapes off) and no FLOPs counted beside it "
                         "(proflab run counts one unprofiled step's)", "FLOPs, MFU and the roofline of operators")
    if ctx.part_digest is not None:
        ctx.part_digest["perf"] = p
    return p


def _ranges_beside_host_only(ctx: Context) -> list[dict[str, Any]]:
    """The ranges' projection, built in a thread of its own while this one builds the
    host-only spans (where ``_while_little_is_held`` builds them: the GPU's work has launch
    links). Both read only the trace and the launches (built first), and spend their time in
    numpy searches and sorts and polars, which run without the GIL: on the 1048 MB export
    (13.8 M events) the two take 1.9 s together where one after the other took 2.7. The
    projection holds one piece of the host table at a time beside the spans' arrays (the
    report's peak RSS unchanged there: 1,386-1,388 MiB). The device tables and the kernel
    rows' tables beside each other were tried too: no faster, and 100 MiB more at the peak.
    The Python frames' index (``ctx.frames``, for the hot kernels' source lines; empty without
    stacks; kept to the end anyway) is built beside them too: the 514 MB Kineto trace's
    analysis 0.75 -> 0.66 s (median of five, alternating), 6-10 MiB more at this phase's peak."""
    if not (ctx.trace.has_gpu and ctx.has_launch_links):
        return _ranges(ctx)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2, thread_name_prefix="proflab-ranges") as pool:
        projected = pool.submit(_ranges, ctx)
        frames = pool.submit(getattr, ctx, "frames")
        ctx.host_only
        frames.result()
        return projected.result()


def _while_little_is_held(ctx: Context) -> None:
    """Build the tables with the largest temporaries while the context holds little else, and
    free each big one once what is read from it exists, so no table's temporaries sit on top
    of all the others. After the ranges and, beside them, the host-only spans
    (``_ranges_beside_host_only``: only the launches held; the rules want the spans whenever
    the GPU has idle gaps of the host); then what
    is read from the kernel rows (hot kernels, launch statistics, the kernels' operators, the
    FP32 GEMMs, the kernels' total time), and the kernel rows are freed; then the step table
    and breakdowns, and the device sets' levels are freed (only all activity, ``busy``, stays).

    1048 MB export (13.8 M events), live peak by phase: 1,695 MiB (host-only spans beside
    every kept table) -> 1,518 MiB (the gaps); ``bench_nsys_large.py`` 1,683 -> 1,527 MiB.
    A caller that goes on using the context computes a freed table again: the comparison's
    trace part reads the kernel rows, a job's rank summary the compute set (0.14-0.20 s and 0.13-0.20 s
    on that export)."""
    trace = ctx.trace
    if not trace.has_gpu:
        return
    first = ("host_only",) if ctx.has_launch_links else ()
    for name in (*first, "_hot_kernels", "launch_stats", "kernel_ops", "fp32_gemms", "kernel_time_by_name", "kernel_time_ns"):
        getattr(ctx, name)
    ctx.drop("kernel_rows")
    # the device sets' levels serve the breakdowns and the step table
    ctx.free_device_levels("device_breakdowns", "device_info")


def _memory(ctx: Context):
    """The memory analysis when the trace records allocations (``analysis.memory``); a source
    that cannot be used is noted as missing, never fatal to the rest of the report."""
    from proflab.analysis.memory import memory_for_trace
    from proflab.errors import InputError

    try:
        m = memory_for_trace(ctx.trace)
    except InputError as e:
        ctx.note_missing("memory", str(e), "memory section")
        return None
    if m is None:
        return None
    if not m.devices:
        for x in m.missing:  # said only where the input was meant to carry memory
            if (ctx.trace.meta.profile_memory and ctx.trace.has_gpu) or "nsys_memory_usage" in m.sources:
                ctx.note_missing(x.signal, x.reason, *x.skipped)
        return None
    for x in m.missing:
        ctx.note_missing(x.signal, x.reason, *x.skipped)
    return m


def _source(trace: Trace) -> dict[str, Any]:
    m = trace.meta
    return {
        "inputs": [
            {
                "path": m.source,
                "format": m.format,
                "format_version": m.format_version,
                "size_bytes": m.size_bytes,
                "events": m.event_count,
                "with_stack": m.with_stack,
                "record_shapes": m.record_shapes,
                "versions": m.versions,
                # read in a part for the memory budget: the budget, and the events the part holds
                **({"memory_budget_bytes": m.budget, "analysed_events": trace.gpu.height + trace.cpu.height} if m.budget is not None else {}),
            }
        ],
        "tool": {"name": "proflab", "version": __version__},
        "distributed": m.distributed,
    }


def _device(ctx: Context) -> dict[str, Any]:
    info = ctx.device_info
    if not info:
        return {"name": None}
    peaks = datasheet_peaks(info.get("name"), info.get("sm_count"))
    cc = info.get("compute_major")
    out: dict[str, Any] = {
        "id": info.get("device"),
        "name": info.get("name"),
        "sm_count": info.get("sm_count"),
        "compute_capability": None if cc is None else f"{cc}.{info.get('compute_minor')}",
        "memory_gib": None if info.get("total_memory_bytes") is None else round(info["total_memory_bytes"] / 2**30, 1),
    }
    if peaks:
        out.update(
            peak_source=f"datasheet ({peaks.model})",
            peak_hbm_gbps=peaks.hbm_gbps,
            peak_fp32_tflops=peaks.fp32_tflops,
            peak_tf32_tflops=peaks.tf32_tflops,
            peak_bf16_tflops=peaks.bf16_tflops,
        )
    return out


def _summary(ctx: Context) -> dict[str, Any]:
    return summary_of(ctx.window, ctx.device_breakdowns, ctx.memcpy_table, ctx.step_table, ctx.trace.steps.height,
                      ctx.observer if ctx.trace.has_gpu else None)


def summary_of(window: tuple[int, int], breakdowns: dict, memcpy: pl.DataFrame, st: pl.DataFrame, step_count: int,
               obs) -> dict[str, Any]:
    """The report's summary from the analysis' tables (``report.combine`` gives those of a
    trace analysed in parts)."""
    lo, hi = window
    out: dict[str, Any] = {"wall_ms": ms(hi - lo), "window_start_ns": lo, "window_end_ns": hi}
    per_device = []
    for device, b in breakdowns.items():
        per_device.append(
            {
                "device": device,
                "gpu_busy_pct": round(b.busy_pct, 2),
                "breakdown_ms": {
                    "compute": ms(b.compute_ns),
                    "communication": ms(b.communication_ns),
                    "memcpy": ms(b.memcpy_ns),
                    "memset": ms(b.memset_ns),
                    "idle": ms(b.idle_ns),
                },
            }
        )
    out["devices"] = per_device
    if per_device:
        n = len(per_device)
        out["gpu_busy_pct"] = round(sum(d["gpu_busy_pct"] for d in per_device) / n, 2)
        out["breakdown_ms"] = {
            k: round(sum(d["breakdown_ms"][k] for d in per_device) / n, 3) for k in per_device[0]["breakdown_ms"]
        }
    else:
        out["gpu_busy_pct"] = None
        out["breakdown_ms"] = None
    m = memcpy
    out["memcpy_by_direction_ms"] = (
        {str(k): ms(v) for k, v in m.group_by("copy_kind").agg(pl.col("time_ns").sum()).sort("copy_kind").iter_rows()}
        if m.height
        else {}
    )
    out["step_count"] = step_count
    if st.height:
        # Step time is what the GPU experiences (GPU-side windows, see analysis.timeline.steps); the
        # host's ProfilerStep ranges go beside it, since they differ when the host runs ahead.
        d = st["dur_ns"].cast(pl.Float64)
        sides = set(st["side"].cast(pl.String).unique().to_list())
        out["step_side"] = "gpu" if sides == {"gpu"} else ("host" if sides == {"host"} else "mixed")
        out["median_step_ms"] = ms(d.median())
        out["median_cpu_step_ms"] = ms(st["cpu_dur_ns"].cast(pl.Float64).median())
        out["step_spread_ms"] = {
            "min": ms(d.min()),
            "p10": ms(d.quantile(0.1, "linear")),
            "p90": ms(d.quantile(0.9, "linear")),
            "max": ms(d.max()),
        }
    else:
        out["step_side"] = None
        out["median_step_ms"] = None
        out["median_cpu_step_ms"] = None
        out["step_spread_ms"] = None
    out["observer"] = obs.to_dict() if obs else None
    return out


def _kernels(ctx: Context, top: int) -> list[dict[str, Any]]:
    rows = kernels_of(ctx.hot_kernels(top))
    regions = ctx.compiled.kernel_regions
    for r in rows if regions else ():  # a compiled program: which compiled region launched each
        r["compiled_region"] = regions.get(r["name"])
    return rows


def kernels_of(t: pl.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for r in t.iter_rows(named=True):
        rows.append(
            {
                "name": r["name"],
                "count": r["count"],
                "total_ms": ms(r["total_ns"]),
                "mean_us": us(r["mean_ns"]),
                "median_us": us(r["median_ns"]),
                "max_us": us(r["max_ns"]),
                "share_pct": round(r["share_pct"], 2),
                "devices": r["devices"],
                "grid": r["grid"],
                "block": r["block"],
                "registers": r["registers"],
                "shared_mem_bytes": r["shared_mem_bytes"],
                "tensor_cores": "yes" if r["tensor_cores"] else ("no" if r["is_gemm"] else None),
                "is_gemm": r["is_gemm"],
                "is_comm": r["is_comm"],
                "op": r["op"],
                "source": r["source"],
            }
        )
    return rows


def _steps(ctx: Context) -> list[dict[str, Any]]:
    return steps_of(ctx.step_table, ctx.trace.has_gpu)


def steps_of(t: pl.DataFrame, has_gpu: bool) -> list[dict[str, Any]]:
    if not has_gpu:  # missing is not zero: no GPU columns at all
        return [{"step": r["step"], "device": None, "side": "host", "dur_ms": ms(r["dur_ns"])} for r in t.iter_rows(named=True)]
    return [
        {
            "step": r["step"],
            "device": r["device"],
            "side": str(r["side"]),
            "dur_ms": ms(r["dur_ns"]),
            "cpu_dur_ms": ms(r["cpu_dur_ns"]),
            "gpu_busy_pct": round(r["busy_pct"], 2),
            "compute_ms": ms(r["compute_ns"]),
            "communication_ms": ms(r["communication_ns"]),
            "memcpy_ms": ms(r["memcpy_ns"]),
            "memset_ms": ms(r["memset_ns"]),
            "idle_ms": ms(r["idle_ns"]),
        }
        for r in t.iter_rows(named=True)
    ]


def _memcpy(ctx: Context) -> list[dict[str, Any]]:
    return memcpy_of(ctx.memcpy_table)


def memcpy_of(t: pl.DataFrame) -> list[dict[str, Any]]:
    return [
        {
            "direction": str(r["copy_kind"]),
            "memory": f"{r['src_kind']} -> {r['dst_kind']}",
            "pageable": r["pageable"],
            "count": r["count"],
            "bytes": r["bytes"],
            "time_ms": ms(r["time_ns"]),
            "achieved_gbps": None if r["bytes"] is None else round(r["gbps"], 2),
        }
        for r in t.iter_rows(named=True)
    ]


def _launch(ctx: Context) -> dict[str, Any]:
    return launch_of(ctx.launch_stats) if ctx.trace.has_gpu else {}


def launch_of(s) -> dict[str, Any]:
    return {
        "kernels": s.kernel_count,
        "median_kernel_us": us(s.median_kernel_ns),
        "kernels_under_5us_pct": None if s.short_kernel_pct is None else round(s.short_kernel_pct, 1),
        "launch_calls": s.launch_calls,
        "median_launch_call_us": us(s.median_launch_call_ns),
        "median_launch_to_start_us": us(s.median_delay_ns),
        "p90_launch_to_start_us": us(s.p90_delay_ns),
        "launches_per_step": s.launches_per_step,
    }


def _idle(ctx: Context) -> dict[str, Any]:
    return idle_of(gaps_by_cause(ctx.gaps), len(ctx.busy)) if ctx.trace.has_gpu else {}


def gaps_by_cause(gaps: pl.DataFrame) -> pl.DataFrame:
    """Idle gaps per cause: their number (``n``) and time (``ns``)."""
    return gaps.group_by(pl.col("cause").cast(pl.String)).agg(pl.len().alias("n"), pl.col("dur_ns").sum().alias("ns"))


def idle_of(by: pl.DataFrame, devices: int) -> dict[str, Any]:
    got = {str(r["cause"]): r for r in by.iter_rows(named=True)}
    n = max(devices, 1)
    # per device on average, like summary.breakdown_ms, so the causes add up to its idle
    return {
        "by_cause_ms": {c: ms(got[c]["ns"] / n) if c in got else 0.0 for c in CAUSES},
        "gaps_by_cause": {c: got[c]["n"] if c in got else 0 for c in CAUSES},
        "devices": devices,
        "note": f"idle ms averaged over {n} devices; gap counts summed" if n > 1 else None,
    }


def _ranges(ctx: Context, top: int = 15) -> list[dict[str, Any]]:
    return ranges_of(ctx.range_table, top)


def ranges_of(t: pl.DataFrame, top: int = 15) -> list[dict[str, Any]]:
    return [
        {
            "name": r["name"],
            "device": r["device"],
            "ranges": r["ranges"],
            "host_ms": ms(r["host_ns"]),
            "gpu_ms": ms(r["gpu_ns"]),
            "launches": r["launches"],
        }
        for r in t.head(top).iter_rows(named=True)
    ]


def _host_ops(trace: Trace, top: int = 10) -> list[dict[str, Any]]:
    return host_ops_of(host_op_table(trace), top)


def host_op_table(trace: Trace) -> pl.DataFrame:
    """Host operators by name: ``count`` and ``total_ns``, most time first."""
    # (lazily: the operators' names are grouped where they lie, not copied out first; the 1 GB
    # realistic trace's copy took 69 MiB and 0.04-0.06 s, the lazy query 0.02 s)
    return (
        trace.cpu.lazy().filter(pl.col("cat") == "cpu_op").group_by("name")
        .agg(pl.len().cast(pl.Int64).alias("count"), pl.col("dur_ns").sum().alias("total_ns"))
        .collect()
        .sort("total_ns", "name", descending=[True, False])
    )


def host_ops_of(t: pl.DataFrame, top: int = 10) -> list[dict[str, Any]]:
    t = t.head(top)
    return [{"name": r["name"], "count": r["count"], "total_ms": ms(r["total_ns"])} for r in t.iter_rows(named=True)]
