"""The public entry points behind ``proflab.load``, ``analyze``, ``compare`` and ``energy``.

This module only composes: each function is the documented signature of work done in the
layers below (readers, report), which never import it; neither does the CLI. A Comparison
made here shows in a notebook through the Markdown renderer's view.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from proflab.model import Trace
from proflab.readers.budget import DEFAULT_BUDGET
from proflab.report import JobReport, Report

__all__ = ["load", "analyze", "compare", "energy"]


def _notebook_html(subject) -> str:
    """A report or a job shown in a notebook: its single-file HTML report in a frame of its
    own (``srcdoc``), so the page's styles, scripts and content policy stay inside it."""
    import html

    from proflab.render.html import render_html

    page = render_html(subject if isinstance(subject, JobReport) else [subject])
    return (f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width:100%;height:900px;border:1px solid #ddd" '
            f'title="proflab report"></iframe>')


# a Report or a JobReport shows itself in Jupyter as its HTML report (the renderer sits above
# the report layer, so it is handed in here, where both are in reach)
Report.html_view = _notebook_html
JobReport.html_view = _notebook_html


def load(path: str | Path, *, cache: bool | None = None, steps: str | None = None, window: str | None = None,
         memory_budget: int | None = DEFAULT_BUDGET) -> Trace:
    """Read a trace file (Kineto JSON, JSON.gz or JSON.xz, Nsight Systems export) into the columnar model.

    ``cache``: keep/reuse the normalized tables in the columnar cache (default: for files of
    16 MB and more; False: never). ``steps="10:20"`` keeps profiler steps 10 to 19,
    ``window="100ms:250ms"`` a time window from the trace's first event (see
    ``proflab.model.slicing``). ``memory_budget`` (bytes, default 1.5 GB; None: no limit):
    a trace whose whole analysis is estimated to need more is read in a part from its middle
    that fits, and the trace's notes say which and how far it is like the whole trace
    (``proflab.readers.budget``)."""
    from proflab.readers import load_trace

    return load_trace(path, cache=cache, steps=steps, window=window, memory_budget=memory_budget)


def analyze(trace: Trace | str | Path, *, top_kernels: int = 15, bare_step_ms: float | None = None, all_parts: bool = False,
            memory_budget: int | None = DEFAULT_BUDGET, cache: bool | None = None,
            on_part: Callable[[int, str], None] | None = None) -> Report:
    """Every analysis and rule over one trace; returns the :class:`Report`.

    ``bare_step_ms``: the loop's step time measured without the profiler (ms), when known:
    host- and launch-bound verdicts are then judged against it instead of an estimate.
    A path is read as :func:`load` reads it (``memory_budget``, ``cache``); with
    ``all_parts``, a trace over the budget is analysed in consecutive parts that each fit,
    every event, and reported as one (``proflab.report.combine``) instead of in one part
    from its middle; ``on_part(n, label)`` is called as each is analysed."""
    from proflab.report.analyze import analyze as _analyze

    return _analyze(trace, top_kernels=top_kernels, bare_step_ms=bare_step_ms, all_parts=all_parts,
                    memory_budget=memory_budget, cache=cache, on_part=on_part)


def compare(before: Any, after: Any, *, threshold_pct: float | None = None, top_kernels: int = 15,
            unprofiled_steps_ms: tuple[list[float], list[float]] | None = None, load_trace: Any = None,
            cache: bool | None = None, steps: str | None = None, window: str | None = None,
            memory_budget: int | None = DEFAULT_BUDGET, all_parts: bool = False,
            on_part: Callable[[int, str], None] | None = None):
    """Compare two runs: each a trace (path or :class:`Trace`), a list of them (a trace set),
    a folder of traces, or a ``proflab run`` directory (its traces, ``meta.json`` and
    ``monitor.parquet``). Returns a :class:`proflab.report.compare.Comparison` whose
    tables are polars DataFrames. ``threshold_pct`` replaces the default noise floor (%);
    ``unprofiled_steps_ms``: (before, after) step times in ms measured without the profiler,
    which the verdict then rests on. ``cache``, ``steps``, ``window`` and ``memory_budget`` as for :func:`load`;
    a trace file compared before is answered from the report cache (its report and the small
    tables the comparison needs) without reading it. ``load_trace``, when given, must read
    with the same ``cache``, ``steps``, ``window`` and ``memory_budget``. ``all_parts``: a
    trace file over the budget is analysed whole, in consecutive parts that each fit, as
    :func:`analyze` does with it (not with ``steps`` or ``window``); ``on_part(n, label)`` is
    called as each part is analysed."""
    from proflab.render.markdown import render_compare_html
    from proflab.report.compare import compare_runs

    result = compare_runs(before, after, threshold_pct=threshold_pct, top_kernels=top_kernels,
                          unprofiled_steps_ms=unprofiled_steps_ms, load_trace=load_trace, cache=cache, steps=steps,
                          window=window, memory_budget=memory_budget, all_parts=all_parts, on_part=on_part)
    result.html_view = render_compare_html  # how it shows in a notebook
    return result


def energy(run_dir: str | Path, *, traces: list | None = None, flops_per_step: float | None = None):
    """Energy of a ``proflab run`` directory (``proflab.energy/1``): per GPU from the NVML
    energy counter, per profiled window, step and user range where the counter resolves them,
    TFLOPS/W where the FLOPs are known (``flops_per_step``: one rank's FLOPs per step, else
    the model FLOPs of the operators a ``--record-shapes`` trace holds, of the step ``proflab run``
    counted, or of the run's Nsight Compute counts), and the ``power_capped`` /
    ``thermal_throttled`` findings. Returns an :class:`proflab.analysis.energy.EnergyAnalysis`."""
    from proflab.report.energy import energy as _energy

    return _energy(run_dir, traces=traces, flops_per_step=flops_per_step)
