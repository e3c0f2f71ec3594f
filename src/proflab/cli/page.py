"""What the HTML report of a path shows, gathered: the same reports ``analyze`` makes, plus the
overview timeline of each analysed window and, for a ``proflab run`` directory, its GPU monitor
samples, its energy and its Nsight Compute results.

``html_report(paths)`` is what ``proflab report`` and ``proflab analyze -o x.html`` write. It
reads, analyses and renders, so it sits with the command, above every layer it uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["html_report"]


def html_report(paths: Sequence[str | Path], *, load: Callable[[Any], Any] | None = None, top_kernels: int = 15,
                bare_step_ms: float | None = None, job: bool = True, title: str | None = None,
                cache: dict[str, Any] | None = None, all_parts: bool = False,
                on_part: Callable[[int, str], None] | None = None, shown: list | None = None) -> str:
    """The HTML page for ``paths``: one trace, several (the ranks of one job get the job
    view), a folder of traces or a run directory. ``load`` reads one trace (default
    ``proflab.load``). ``cache``: the reading options ``load`` uses (``cache``, ``steps``,
    ``window``, ``memory_budget``; a job's ranks are read with them too); with them, the page
    of one trace file is built from the report cache (its report and timeline) when it was
    made before, without reading the trace. ``all_parts``: one trace file over the memory
    budget is analysed in consecutive parts that each fit (``report.combine``), its timeline
    combined from the parts' (``on_part(n, label)`` called as each is analysed); a run
    directory's energy is then not shown (``proflab energy`` gives it). ``shown``: a list the
    page's reports (a list of them, or a job's report) are appended to, for what else is
    written from them (``analyze --roofline``)."""
    from proflab.collect.rundir import unprofiled_step_ms
    from proflab.readers import expand_paths

    files = expand_paths([str(p) for p in paths])
    run_dir = Path(paths[0]) if len(paths) == 1 and Path(paths[0]).is_dir() else None
    if all_parts:
        return _in_parts(files, run_dir, top_kernels=top_kernels, bare_step_ms=bare_step_ms, title=title,
                         reading=cache or {}, on_part=on_part, shown=shown)
    monitor, energy = _run_extras(run_dir)
    if len(files) >= 2 and job:
        from proflab.report import job as jobs
        from proflab.analysis.context import Context
        from proflab.analysis.overview import overview
        from proflab.readers import load_trace as _load

        read = load or _load

        try:
            rep = jobs.analyze_job(files, top_kernels=top_kernels, bare_step_ms=bare_step_ms, **(cache or {}))
        except jobs.NotAJob:
            rep = None
        if rep is not None:
            # each rank's timeline: its trace read again (the cache makes that cheap for big ones)
            overviews = [overview(Context(read(f))) for f in files] if len(files) <= 8 else []
            return _drawn(shown, rep, overviews=overviews, monitor=monitor, energy=energy, title=title)
    reports, overviews = [], []
    deep = _ncu_pages(run_dir)
    key = None
    if cache is not None and len(files) == 1 and not deep:
        from proflab.report import cache as report_cache

        options = {"html": 1, "top": top_kernels, "bare_step_ms": bare_step_ms or unprofiled_step_ms(files[0]),
                   "steps": cache.get("steps"), "window": cache.get("window"), "job": job, "memory_budget": cache.get("memory_budget")}
        key = report_cache.key(files[0], options, cache.get("cache"))
        got = report_cache.get_with_extra(key)
        if got is not None and isinstance(got[1], dict) and "overview" in got[1]:
            return _drawn(shown, [got[0]], overviews=[got[1]["overview"]], monitor=monitor, energy=energy, title=title)
    from proflab.analysis.context import Context
    from proflab.analysis.overview import overview
    from proflab.readers import load_trace as _load
    from proflab.report.assemble import report_for

    read = load or _load
    traces = {}
    if len(files) == 1 and job and not deep:
        trace = traces[files[0]] = read(files[0])
        if trace.meta.format != "kineto":
            # an Nsight Systems export of a whole job holds every rank's process
            from proflab.report.job import analyze_processes

            rep = analyze_processes(trace, top_kernels=top_kernels, bare_step_ms=bare_step_ms)
            if rep is not None:
                return _drawn(shown, rep, monitor=monitor, energy=energy, title=title)
    for f in files:
        trace = traces.pop(f) if f in traces else read(f)
        ctx = Context(trace, bare_step_ms=bare_step_ms or unprofiled_step_ms(f))
        if deep:
            from proflab.report.deepdive import deep_dive
            from proflab.readers.ncu import load as load_ncu

            reports.append(deep_dive(load_ncu(deep), trace, top_kernels=top_kernels))
        else:
            reports.append(report_for(ctx, top_kernels=top_kernels))
        # what the report kept that the overview does not read (it reads the window, steps and
        # gaps): freed before the overview's own temporaries (the 1 GB export's launches: 49 MiB)
        ctx.drop("launches", "host_only", "blocking", "fp32_gemms", "kernel_ops")
        overviews.append(overview(ctx) if trace.has_gpu or trace.steps.height else None)
    if key is not None:  # (one Kineto trace, or an export of one process: a job page returned above)
        report_cache.put(key, reports[0], extra={"overview": overviews[0]})
    return _drawn(shown, reports, overviews=overviews, monitor=monitor, energy=energy, title=title)


def _in_parts(files: list[Path], run_dir: Path | None, *, top_kernels: int, bare_step_ms: float | None, title: str | None,
              reading: dict[str, Any], on_part: Callable[[int, str], None] | None, shown: list | None = None) -> str:
    """The page of one trace file analysed in parts (``html_report``'s ``all_parts``), from the
    report cache when made before with the same options."""
    from proflab.analysis.overview import combined_overview, overview, part_overview
    from proflab.collect.rundir import unprofiled_step_ms
    from proflab.errors import UsageError
    from proflab.readers import load_parts
    from proflab.readers.budget import DEFAULT_BUDGET
    from proflab.report import cache as report_cache
    from proflab.report.combine import report_in_parts

    if len(files) != 1:
        raise UsageError(f"--all-parts makes the page of one trace file ({len(files)} given): one page per trace")
    path, budget = files[0], reading.get("memory_budget", DEFAULT_BUDGET)
    monitor, _ = _run_extras(run_dir)  # (its energy reads the traces' windows again: not with all parts)
    bare = bare_step_ms or unprofiled_step_ms(path)
    options = {"html": 1, "top": top_kernels, "bare_step_ms": bare, "all_parts": True, "memory_budget": budget}
    key = report_cache.key(path, options, reading.get("cache"))
    got = report_cache.get_with_extra(key)
    if got is not None and isinstance(got[1], dict) and "overview" in got[1]:
        return _drawn(shown, [got[0]], overviews=[got[1]["overview"]], monitor=monitor, title=title)
    views: list[tuple[int, int, Any, bool]] = []  # window, overview, whether of the whole trace

    def each(ctx) -> None:
        ctx.drop("launches", "host_only", "blocking", "fp32_gemms", "kernel_ops")  # (as for a whole trace's page)
        if ctx.part_digest is None:  # read whole (the budget held it): the page's own overview
            views.append((*ctx.window, overview(ctx) if ctx.trace.has_gpu or ctx.trace.steps.height else None, True))
        else:
            views.append((*part_overview(ctx), False))

    if budget is None:  # no budget: the trace is read whole
        parts = iter([_whole(path, reading)])
    else:
        parts = load_parts(path, budget=budget, cache=reading.get("cache"))
    report = report_in_parts(parts, top_kernels=top_kernels, bare_step_ms=bare, on_part=on_part, each=each)
    if run_dir is not None and (run_dir / "monitor.parquet").is_file():
        import dataclasses

        report = dataclasses.replace(report, notes=(*report.notes, "energy: not analysed with --all-parts (it reads the traces' "
                                                    "windows and steps again, past the budget); proflab energy RUN_DIR analyses it"))
    if views[0][3]:
        view = views[0][2]
    else:
        view = combined_overview([(lo, v) for lo, _, v, _ in views], min(v[0] for v in views), max(v[1] for v in views))
    if key is not None:
        report_cache.put(key, report, extra={"overview": view})
    return _drawn(shown, [report], overviews=[view], monitor=monitor, title=title)


def _drawn(shown: list | None, reports, **kw) -> str:
    """The page of ``reports`` (``render.html.render_html``), noted in ``shown``."""
    from proflab.render.html import render_html

    if shown is not None:
        shown.append(reports)
    return render_html(reports, **kw)


def _whole(path: Path, reading: dict[str, Any]):
    from proflab.readers import load_trace as load

    return load(path, cache=reading.get("cache"), memory_budget=None)


def _ncu_pages(run_dir: Path | None) -> list[Path]:
    if run_dir is None or not (run_dir / "ncu" / "raw.csv").exists():
        return []
    d = run_dir / "ncu"
    return [d / "raw.csv"] + ([d / "details.csv"] if (d / "details.csv").exists() else [])


def _run_extras(run_dir: Path | None) -> tuple[Any, dict[str, Any] | None]:
    """A run directory's monitor samples and energy (None where it has none; an energy
    analysis that fails is left out, never the page)."""
    if run_dir is None or not (run_dir / "monitor.parquet").is_file():
        return None, None
    from proflab.errors import ProflabError
    from proflab.readers.monitor import read_monitor

    monitor = read_monitor(run_dir / "monitor.parquet")  # a damaged file: one line, like every bad input
    try:
        from proflab.report.energy import energy

        en = energy(run_dir).to_dict()
    except ProflabError:
        en = None
    return monitor, en
