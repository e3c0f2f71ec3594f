"""The analysis entry points behind ``proflab.load`` and ``proflab.analyze``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from proflab.analysis.context import Context
from proflab.model import Trace
from proflab.errors import InputError, ProflabError, UnsupportedFormat, UsageError
from proflab.report import Report
from proflab.report.assemble import report_for

__all__ = ["load", "analyze", "compare", "energy"]

def load(path: str | Path, *, cache: bool | None = None, steps: str | None = None, window: str | None = None) -> Trace:
    """Read a trace file (Kineto JSON or JSON.gz, Nsight Systems export) into the columnar model.

    ``cache``: keep/reuse the normalized tables in the columnar cache (default: for files of
    16 MB and more; False: never). ``steps="10:20"`` keeps profiler steps 10 to 19,
    ``window="100ms:250ms"`` a time window from the trace's first event (see
    ``proflab.model.slicing``)."""
    from proflab.model.slicing import parse_steps, parse_window
    from proflab.readers import load as _load

    if steps is not None and window is not None:
        from proflab.errors import UsageError

        raise UsageError("give steps or window, not both")
    part = parse_steps(steps) if steps is not None else parse_window(window) if window is not None else None
    return _load(path, cache=cache, part=part)


def analyze(trace: Trace | str | Path, *, top_kernels: int = 15, bare_step_ms: float | None = None) -> Report:
    """Every analysis and rule over one trace; returns the :class:`Report`.

    ``bare_step_ms``: the loop's step time measured without the profiler (ms), when known:
    host- and launch-bound verdicts are then judged against it instead of an estimate."""
    if not isinstance(trace, Trace):
        trace = load(trace)
    try:
        return report_for(Context(trace, bare_step_ms=bare_step_ms), top_kernels=top_kernels)
    except (InputError, UsageError):
        raise
    except ProflabError as e:  # a trace the analyses cannot place (a damaged clock): name it
        raise UnsupportedFormat(trace.meta.source or "trace", str(e)) from e


def compare(before: Any, after: Any, *, threshold_pct: float | None = None, top_kernels: int = 15,
            unprofiled_steps_ms: tuple[list[float], list[float]] | None = None, load_trace: Any = None):
    """Compare two runs: each a trace (path or :class:`Trace`), a list of them (a trace set),
    a folder of traces, or a ``proflab run`` directory (its traces, ``meta.json`` and
    ``monitor.parquet``). Returns a :class:`proflab.analysis.compare.Comparison` whose
    tables are polars DataFrames. ``threshold_pct`` replaces the default noise floor (%);
    ``unprofiled_steps_ms``: (before, after) step times in ms measured without the profiler,
    which the verdict then rests on."""
    from proflab.analysis.compare import compare as _compare

    read = load_trace or load
    return _compare(_side(before, "before", read, top_kernels), _side(after, "after", read, top_kernels), threshold_pct=threshold_pct,
                    unprofiled_steps_ms=unprofiled_steps_ms)


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


def _side(what: Any, tag: str, read: Any, top_kernels: int):
    """One side of a comparison from what ``compare`` accepts."""
    import json

    from proflab.analysis.compare import Side
    from proflab.errors import SchemaError
    from proflab.readers import expand_paths

    items = list(what) if isinstance(what, (list, tuple)) else [what]
    run, monitor, traces = None, None, []
    for item in items:
        if isinstance(item, Trace):
            traces.append(item)
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
                monitor = pl.read_parquet(p / "monitor.parquet")
        traces.extend(read(f) for f in expand_paths([p]))
    contexts = tuple(Context(t) for t in traces)
    reports = tuple(report_for(c, top_kernels=top_kernels) for c in contexts)
    label = str(items[0]) if len(items) == 1 and not isinstance(items[0], Trace) else f"{tag} ({len(traces)} traces)"
    return Side(label, reports, contexts, run, monitor)
