"""One job report from the traces of all ranks: one task per rank trace, then a reduction.

Each task reads one rank's trace, runs the rank's own analysis (its :class:`Report`) and
reduces it to a :class:`~proflab.analysis.ranks.RankSummary` (a few small tables): only
those travel back. The cross-rank tables and the job's findings are computed from the
summaries. A job of a few ranks runs its tasks in this process; more ranks (or an explicit
scheduler) run on Dask (``dask.distributed``: a ``LocalCluster`` of this machine's cores by
default, or the cluster at ``scheduler``). Scheduling is Dask's, never proflab's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from proflab.analysis.ranks import RankSummary, job_tables, link_reference
from proflab.readers.budget import DEFAULT_BUDGET, size_text
from proflab.report import JobReport, Missing

__all__ = ["analyze_job", "analyze_processes", "rank_summaries", "rank_task", "NotAJob", "DASK_FROM_RANKS"]


class NotAJob(Exception):
    """The traces are not one rank each of one job; ``summaries`` holds what was analysed."""

    def __init__(self, message: str, summaries: list) -> None:
        super().__init__(message)
        self.summaries = summaries

# From this many ranks on, tasks go to Dask (starting a local cluster costs ~2 s: below this
# the ranks are read one after the other here).
DASK_FROM_RANKS = 5


def rank_task(path: str, options: dict[str, Any]) -> RankSummary:
    """Read one rank's trace, analyse it, reduce it. Runs in a Dask worker or here."""
    from proflab.analysis.context import Context
    from proflab.analysis.ranks import rank_summary
    from proflab.model.job import rank_of
    from proflab.readers import load_trace
    from proflab.readers.rundir import step_times_of
    from proflab.report.assemble import report_for

    trace = load_trace(path, cache=options.get("cache"), steps=options.get("steps"), window=options.get("window"),
                 memory_budget=options.get("memory_budget", DEFAULT_BUDGET))
    rank = rank_of(trace.meta.distributed, trace.meta.source)
    # a rank trace of a `proflab run` directory: the step times its own process measured
    # without the profiler (processes/<pid>.json) judge that rank's verdicts
    timed = step_times_of(path) or {}
    bare = options.get("bare_step_ms") or timed.get("bare_ms")
    ctx = Context(trace, bare_step_ms=bare)
    report = report_for(ctx, top_kernels=options.get("top_kernels", 15))
    summary = rank_summary(ctx, -1 if rank is None else rank, report=report)
    summary.stats["bare_step_ms"] = float(timed["bare_ms"]) if timed else options.get("bare_step_ms")
    summary.stats["bare_clock"] = (timed.get("clock") or "host") if timed else None  # run directories before the GPU clock: host
    prof = timed.get("profiled_ms")
    summary.stats["profiled_step_ms"] = float(prof) if isinstance(prof, (int, float)) and prof > 0 else None
    return summary


def _run_tasks(
    paths: list[str], options: dict[str, Any], scheduler: str | None, workers: int | None, in_process: bool = False
) -> tuple[list[RankSummary], str]:
    if in_process or (scheduler is None and len(paths) < DASK_FROM_RANKS and not workers):
        return [rank_task(p, options) for p in paths], "in process"
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError as e:
        from proflab.errors import UsageError

        raise UsageError(
            f"analysing {len(paths)} ranks runs on Dask, which is not installed: pip install 'proflab[job]' "
            "(or dask[distributed])"
        ) from e
    if scheduler is not None:
        with Client(scheduler) as client:
            got = client.gather(client.map(rank_task, paths, options=options, pure=False))
        return got, f"Dask cluster at {scheduler}"
    n = workers or None
    with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, Client(cluster) as client:
        got = client.gather(client.map(rank_task, paths, options=options, pure=False))
        used = len(cluster.workers)
    # the budget holds each rank's read: worker processes reading at once on this machine may
    # together hold as many times it (a budget split between them could leave each too little
    # for any analysis, and the job would fail where it fits)
    budget = options.get("memory_budget", DEFAULT_BUDGET)
    each = "" if budget is None else f", each rank read within the {size_text(budget)} memory budget"
    return got, f"Dask LocalCluster, {used} worker process(es){each}"


def analyze_job(
    paths: list[str | Path],
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    top_kernels: int = 15,
    bare_step_ms: float | None = None,
    cache: bool | None = None,
    steps: str | None = None,
    window: str | None = None,
    memory_budget: int | None = DEFAULT_BUDGET,
    in_process: bool = False,
) -> JobReport:
    """The job report over one trace per rank (files, folders or a run directory: see
    ``readers.expand_paths``). ``scheduler``: a Dask scheduler address; ``workers``: local
    Dask workers (default: one per core); ``in_process``: every rank here, whatever their
    number (no Dask). ``memory_budget``: each rank's read's, as ``proflab.load`` takes it."""
    from proflab.readers import expand_paths

    options = {"top_kernels": top_kernels, "bare_step_ms": bare_step_ms, "cache": cache, "steps": steps, "window": window,
               "memory_budget": memory_budget}
    summaries, engine, world = rank_summaries(expand_paths(paths), options, scheduler=scheduler, workers=workers, in_process=in_process)
    return _job_report(summaries, engine, world_size=world)


def rank_summaries(
    paths: list[str | Path], options: dict[str, Any], *, scheduler: str | None = None, workers: int | None = None, in_process: bool = False
) -> tuple[list[RankSummary], str, int | None]:
    """Every rank's summary in rank order, the engine that made them, and the job's declared
    world size. ``options``: rank_task's. Raises NotAJob when the traces are not one rank each."""
    from proflab.errors import UsageError
    from proflab.model.job import Job

    files = [str(p) for p in paths]
    summaries, engine = _run_tasks(files, options, scheduler, workers, in_process)

    try:
        job = Job.from_ranks(
            [None if s.rank < 0 else s.rank for s in summaries], [s.source for s in summaries], [s.stats.get("world_size") for s in summaries]
        )
    except UsageError as e:
        raise NotAJob(str(e), summaries) from None
    by_source = {s.source: s for s in summaries}
    return [by_source[x] for x in job.traces], engine, job.world_size


def _job_report(summaries: list[RankSummary], engine: str, *, world_size: int | None = None, extra_notes: list[str] = ()) -> JobReport:
    from proflab.model.job import Job
    from proflab.rules.distributed import job_rules, job_wall_ns

    job = Job(tuple(s.rank for s in summaries), tuple(summaries), world_size)
    tables = job_tables(summaries)
    findings = job_rules(tables, summaries)
    notes = [*extra_notes, *tables.notes]
    if job.world_size is not None and len(job) < job.world_size:
        missing_ranks = sorted(set(range(job.world_size)) - set(job.ranks))
        notes.append(f"{len(job)} of {job.world_size} ranks given; no trace for ranks {missing_ranks}: their waits are not seen")
    coll = tables.collectives
    device = next((s.stats.get("device_name") for s in summaries if s.stats.get("device_name")), None)
    steps_ms = [s.stats["step_ns_median"] / 1e6 for s in summaries if s.stats.get("step_ns_median")]
    wall = job_wall_ns(summaries)
    summary = {
        "ranks": len(job),
        "world_size": job.world_size,
        "backend": next((s.stats.get("backend") for s in summaries if s.stats.get("backend")), None),
        "device": device,
        "wall_ms": round(wall / 1e6, 3),
        "median_step_ms_slowest_rank": round(max(steps_ms), 3) if steps_ms else None,
        "median_step_ms_fastest_rank": round(min(steps_ms), 3) if steps_ms else None,
        "collectives_matched": coll.height,
        "skew_median_ms": None if coll.height == 0 else round(float(coll["skew_ns"].median()) / 1e6, 3),
        "skew_p90_ms": None if coll.height == 0 else round(float(coll["skew_ns"].cast(pl.Float64).quantile(0.9, "linear")) / 1e6, 3),
        "end_spread_median_us": None if coll.height == 0 else round(float(coll["end_spread_ns"].median()) / 1e3, 2),
        "engine": engine,
    }
    missing = [Missing(m.split(":")[0], m.split(": ", 1)[-1], ("bus bandwidth",) if "size" in m or "bytes" in m else ()) for m in tables.missing]
    link = link_reference(device)
    if link is None and coll.height and coll["busbw_gbps"].is_not_null().any():
        missing.append(
            Missing(
                "link peak bandwidth",
                f"{device or 'the device'} is not in proflab's table of GPU links and the trace does not record the topology",
                ("bus bandwidth against the link",),
            )
        )
    return JobReport(
        source={"inputs": [s.source for s in summaries], "ranks": list(job.ranks)},
        summary=summary,
        ranks=tuple(_round_row(r) for r in tables.ranks.to_dicts()),
        collectives=tuple(_collective_rows(coll, link)),
        findings=tuple(findings),
        reports=tuple(s.report for s in summaries),
        link=link,
        missing=tuple(missing),
        notes=tuple(notes),
    )


def analyze_processes(trace, *, top_kernels: int = 15, bare_step_ms: float | None = None) -> JobReport | None:
    """The job report of one trace that holds several ranks' processes (an Nsight Systems
    export of a torchrun job), or None when it does not. Each process is a rank, numbered by
    its GPU index, and the report says so."""
    from proflab.analysis.context import Context
    from proflab.analysis.ranks import rank_summary
    from proflab.report.assemble import report_for
    from proflab.model.job import split_processes

    parts = split_processes(trace)
    if not parts:
        return None
    summaries = []
    for device, t in parts:
        ctx = Context(t, bare_step_ms=bare_step_ms)
        summaries.append(rank_summary(ctx, device, report=report_for(ctx, top_kernels=top_kernels)))
    note = (
        f"{trace.meta.source}: {len(parts)} processes with collectives in one trace; each is taken as the rank of "
        "its GPU index (the trace does not record ranks)"
    )
    return _job_report(summaries, "in process (one trace)", extra_notes=[note])


def _round_row(r: dict[str, Any]) -> dict[str, Any]:
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}


def _collective_rows(coll: pl.DataFrame, link: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per group, collective and message size: how many, the arrival skew, transfer, bus
    bandwidth, and that bandwidth as a share of the link's datasheet peak (null when the
    link is not known)."""
    if coll.height == 0:
        return []
    t = (
        coll.group_by("group", "collective", "bytes")
        .agg(
            pl.len().alias("count"),
            (pl.col("skew_ns").median() / 1e6).alias("skew_median_ms"),
            (pl.col("skew_ns").max() / 1e6).alias("skew_max_ms"),
            pl.col("last_rank").mode().first().alias("most_often_last_rank"),
            (pl.col("transfer_ns").median() / 1e6).alias("transfer_median_ms"),
            pl.col("busbw_gbps").median().alias("busbw_gbps"),
        )
        .sort("group", "collective", "bytes", nulls_last=True)
    )
    peak = None if link is None else link["gbps_per_direction"]
    t = t.with_columns((pl.col("busbw_gbps") / peak * 100 if peak else pl.lit(None, pl.Float64)).alias("busbw_of_link_pct"))
    return [_round_row(r) for r in t.to_dicts()]
