"""The analysis entry points behind ``proflab.load`` and ``proflab.analyze``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from proflab.analysis.context import Context
from proflab.model import Trace
from proflab.errors import InputError, ProflabError, UnsupportedFormat, UsageError
from proflab.report import Report
from proflab.readers.budget import DEFAULT_BUDGET
from proflab.report.assemble import report_for

__all__ = ["load", "analyze", "compare", "energy"]

def load(path: str | Path, *, cache: bool | None = None, steps: str | None = None, window: str | None = None,
         memory_budget: int | None = DEFAULT_BUDGET) -> Trace:
    """Read a trace file (Kineto JSON or JSON.gz, Nsight Systems export) into the columnar model.

    ``cache``: keep/reuse the normalized tables in the columnar cache (default: for files of
    16 MB and more; False: never). ``steps="10:20"`` keeps profiler steps 10 to 19,
    ``window="100ms:250ms"`` a time window from the trace's first event (see
    ``proflab.model.slicing``). ``memory_budget`` (bytes, default 1.5 GB; None: no limit):
    a trace whose whole analysis is estimated to need more is read in a part from its middle
    that fits, and the trace's notes say which and how far it is like the whole trace
    (``proflab.readers.budget``)."""
    from proflab.model.slicing import parse_steps, parse_window
    from proflab.readers import load as _load

    if steps is not None and window is not None:
        from proflab.errors import UsageError

        raise UsageError("give steps or window, not both")
    part = parse_steps(steps) if steps is not None else parse_window(window) if window is not None else None
    return _load(path, cache=cache, part=part, budget=memory_budget)


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
    if all_parts and not isinstance(trace, Trace):
        if memory_budget is None:  # no budget: every event is read at once
            return analyze(load(trace, cache=cache, memory_budget=None), top_kernels=top_kernels, bare_step_ms=bare_step_ms)
        from proflab.readers import load_parts
        from proflab.report.combine import report_in_parts

        return _placed(lambda: report_in_parts(load_parts(trace, budget=memory_budget, cache=cache), top_kernels=top_kernels,
                                               bare_step_ms=bare_step_ms, on_part=on_part), str(trace))
    if not isinstance(trace, Trace):
        trace = load(trace, cache=cache, memory_budget=memory_budget)
    return _placed(lambda: report_for(Context(trace, bare_step_ms=bare_step_ms), top_kernels=top_kernels), trace.meta.source or "trace")


def _placed(analyse, source: str) -> Report:
    """``analyse()``, a failure to place the trace's events (a damaged clock) named as the
    trace's."""
    try:
        return analyse()
    except (InputError, UsageError):
        raise
    except ProflabError as e:  # a trace the analyses cannot place (a damaged clock): name it
        raise UnsupportedFormat(source, str(e)) from e


def compare(before: Any, after: Any, *, threshold_pct: float | None = None, top_kernels: int = 15,
            unprofiled_steps_ms: tuple[list[float], list[float]] | None = None, load_trace: Any = None,
            cache: bool | None = None, steps: str | None = None, window: str | None = None,
            memory_budget: int | None = DEFAULT_BUDGET, all_parts: bool = False,
            on_part: Callable[[int, str], None] | None = None):
    """Compare two runs: each a trace (path or :class:`Trace`), a list of them (a trace set),
    a folder of traces, or a ``proflab run`` directory (its traces, ``meta.json`` and
    ``monitor.parquet``). Returns a :class:`proflab.analysis.compare.Comparison` whose
    tables are polars DataFrames. ``threshold_pct`` replaces the default noise floor (%);
    ``unprofiled_steps_ms``: (before, after) step times in ms measured without the profiler,
    which the verdict then rests on. ``cache``, ``steps``, ``window`` and ``memory_budget`` as for :func:`load`;
    a trace file compared before is answered from the report cache (its report and the small
    tables the comparison needs) without reading it. ``load_trace``, when given, must read
    with the same ``cache``, ``steps``, ``window`` and ``memory_budget``. ``all_parts``: a
    trace file over the budget is analysed whole, in consecutive parts that each fit, as
    :func:`analyze` does with it (not with ``steps`` or ``window``); ``on_part(n, label)`` is
    called as each part is analysed."""
    from proflab.analysis.compare import compare as _compare

    if all_parts and (steps or window):
        raise UsageError(f"all_parts compares every event of each trace; it takes no {'steps' if steps else 'window'}")
    reading = {"cache": cache, "steps": steps, "window": window, "memory_budget": memory_budget}
    read = load_trace or (lambda p: load(p, **reading))
    opts = {**reading, "all_parts": all_parts, "on_part": on_part}
    sides = _side(before, "before", read, top_kernels, opts), _side(after, "after", read, top_kernels, opts)
    result = _compare(*sides, threshold_pct=threshold_pct, unprofiled_steps_ms=unprofiled_steps_ms)
    if all_parts and any(s.run is not None for s in sides):
        # (a run directory's energy per step reads its traces' windows and steps again, past the budget)
        result.notes.append("energy per step: not compared with all parts (--all-parts); compare the run directories "
                            "without it, or see proflab energy RUN_DIR")
    return result


def energy(run_dir: str | Path, *, traces: list | None = None, flops_per_step: float | None = None):
    """Energy of a ``proflab run`` directory (``proflab.energy/1``): per GPU from the NVML
    energy counter, per profiled window, step and user range where the counter resolves them,
    TFLOPS/W where the FLOPs are known (``flops_per_step``: one rank's FLOPs per step, else
    from the GEMM shapes a ``--record-shapes`` trace holds), and the ``power_capped`` /
    ``thermal_throttled`` findings. Returns an :class:`proflab.analysis.energy.EnergyAnalysis`."""
    from proflab.analysis.energy import analyze_energy
    from proflab.rules.energy import energy_rules

    a = analyze_energy(run_dir, traces=traces, flops_per_step=flops_per_step)
    a.findings, a.missing = energy_rules(a.monitor, power_limits_w=a.power_limits_w, idle_power_w=a.idle_power_w)
    a.findings.sort(key=lambda f: -f.est_gain_ms)
    return a


def _side(what: Any, tag: str, read: Any, top_kernels: int, opts: dict[str, Any] | None = None):
    """One side of a comparison from what ``compare`` accepts."""
    import json

    from proflab.analysis.compare import Side
    from proflab.errors import SchemaError
    from proflab.readers import expand_paths

    items = list(what) if isinstance(what, (list, tuple)) else [what]
    run, monitor, sources = None, None, []
    for item in items:
        if isinstance(item, Trace):
            sources.append(item)
            continue
        p = Path(item)
        if p.is_dir() and (p / "meta.json").is_file():
            if len(items) > 1:
                from proflab.errors import UsageError

                raise UsageError(f"{p}: a run directory is one side of a comparison on its own")
            try:
                run = json.loads((p / "meta.json").read_text())
            except (OSError, ValueError) as e:
                raise SchemaError(p / "meta.json", f"not a readable run record ({e})") from e
            if not isinstance(run, dict):
                raise SchemaError(p / "meta.json", "expected a JSON object")
            if (p / "monitor.parquet").is_file():
                from proflab.readers.monitor import read_monitor

                monitor = read_monitor(p / "monitor.parquet")
        sources.extend(expand_paths([p]))
    if (opts or {}).get("all_parts"):
        monitor = None  # (its energy per step is not compared: see compare)
    # the energy of a run directory needs its traces: such a side is always read
    got = [_trace_part(s, read, top_kernels, opts or {}, keep_trace=monitor is not None) for s in sources]
    reports, parts = tuple(r for r, _ in got), tuple(p for _, p in got)
    label = str(items[0]) if len(items) == 1 and not isinstance(items[0], Trace) else f"{tag} ({len(parts)} traces)"
    return Side(label, reports, parts, run, monitor)


def _trace_part(source: Trace | Path, read: Any, top_kernels: int, opts: dict[str, Any], *, keep_trace: bool):
    """A trace's report and the tables a comparison takes from it: from the report cache when
    the file was compared before with the same options, else read, analysed and kept there."""
    from proflab.analysis.compare import decode_part, encode_part, trace_part
    from proflab.report import cache as report_cache

    key = None
    if isinstance(source, Path) and not keep_trace:
        options = {"compare": 1, "top": top_kernels, "steps": opts.get("steps"), "window": opts.get("window"),
                   "memory_budget": opts.get("memory_budget"), **({"all_parts": True} if opts.get("all_parts") else {})}
        key = report_cache.key(source, options, opts.get("cache"))
        got = report_cache.get_with_extra(key)
        if got is not None and got[1] is not None:
            try:
                return got[0], decode_part(got[1])
            except Exception:  # a damaged entry: analyse again (and replace it)
                pass
    if opts.get("all_parts") and isinstance(source, Path) and opts.get("memory_budget") is not None:
        from proflab.analysis.compare import combined_part
        from proflab.readers import load_parts
        from proflab.report.combine import report_in_parts

        got = []
        report = _placed(lambda: report_in_parts(load_parts(source, budget=opts["memory_budget"], cache=opts.get("cache")),
                                                 top_kernels=top_kernels, each=lambda c: got.append(trace_part(c)),
                                                 on_part=opts.get("on_part")), str(source))
        part = combined_part(got)
    else:
        ctx = Context(source if isinstance(source, Trace) else read(source))
        report = report_for(ctx, top_kernels=top_kernels)
        part = trace_part(ctx, keep_trace=keep_trace)
    if key is not None:
        report_cache.put(key, report, extra=encode_part(part))
    return report, part
