"""What a ``proflab run`` directory tells its readers beyond its traces: the step times each
profiled process measured outside the profiler's window (``processes/<pid>.json``). The
directory's layout is ``collect.rundir``'s, which writes it and re-exports these.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["META", "MIN_BARE_STEPS", "process_info_of", "step_flops_of", "step_times_of", "unprofiled_step_ms", "unprofiled_steps_ms"]

META = "meta.json"
# Fewer bare step intervals are not a measurement of the loop's step time. The runtime inside
# the profiled process (``collect._child``, which imports nothing of proflab) holds the same
# threshold for its summary; a test keeps the two equal.
MIN_BARE_STEPS = 3


def unprofiled_step_ms(trace: str | Path) -> float | None:
    """The unprofiled step time (ms) that ``proflab run`` measured in the process that wrote
    ``trace`` (a file under a run directory's ``traces/``): the median step interval outside
    the profiler's recording, between CUDA events where the process used CUDA, else on the
    host's clock (``processes/<pid>.json``: ``step_times``, its ``clock``). None when the
    trace is not from a run directory or too few steps ran outside the window."""
    st = step_times_of(trace)
    return None if st is None else float(st["bare_ms"])


def unprofiled_steps_ms(path: str | Path) -> list[float] | None:
    """Every unprofiled step time (ms) ``proflab run`` kept for a run directory (or one of its
    traces), all processes together; None when there are too few."""
    path = Path(path)
    traces = sorted((path / "traces").glob("*.json*")) if (path / META).is_file() else [path]
    out: list[float] = []
    for t in traces:
        st = step_times_of(t)
        if st is not None:
            out += [float(x) for x in st.get("bare_steps_ms") or [] if isinstance(x, (int, float))]
    return out if len(out) >= MIN_BARE_STEPS else None


def process_info_of(trace: str | Path) -> dict | None:
    """``processes/<pid>.json`` of the process that wrote ``trace`` (a file under a run
    directory's ``traces/``); None when the trace is not from a run directory."""
    try:
        trace = Path(trace).resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    run_dir = trace.parent.parent if trace.parent.name == "traces" else None
    if run_dir is None or not (run_dir / META).is_file():
        return None
    rel = str(trace.relative_to(run_dir))
    for p in sorted((run_dir / "processes").glob("*.json")):
        try:
            info = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and rel in (info.get("traces") or []):
            return info
    return None


def step_times_of(trace: str | Path) -> dict | None:
    """The ``step_times`` that ``proflab run`` recorded for the process that wrote ``trace``
    (``processes/<pid>.json``), when it holds a bare step time of enough steps; else None."""
    info = process_info_of(trace)
    st = (info or {}).get("step_times") or {}
    n, ms = st.get("bare_n"), st.get("bare_ms")
    if isinstance(n, int) and n >= MIN_BARE_STEPS and isinstance(ms, (int, float)) and ms > 0:
        return st
    return None


def step_flops_of(trace: str | Path) -> dict | None:
    """The FLOPs of one unprofiled training step that ``proflab run`` counted in the process
    that wrote ``trace`` (``processes/<pid>.json``: ``flops``, from
    ``torch.utils.flop_counter``: ``total``, ``by_op``, ``by_dtype``, ``by_module``), when
    it counted some; else None (not a run directory, not counted, or the count failed)."""
    f = (process_info_of(trace) or {}).get("flops")
    return f if isinstance(f, dict) and isinstance(f.get("total"), int) and f["total"] > 0 else None


def compile_record_of(trace: str | Path) -> dict | None:
    """What torch.compile did in the process that wrote ``trace``, as ``proflab run`` read it
    from Dynamo at the process's end (``processes/<pid>.json``: ``compile``: graph breaks,
    recompiles, CUDA graph skips); None where there is none (not a run directory, or a
    program that compiled nothing)."""
    c = (process_info_of(trace) or {}).get("compile")
    return c if isinstance(c, dict) else None
