"""The report of one trace, read if it is a path: what ``proflab.analyze`` does (the public
function in ``proflab.api`` documents it). The CLI, ``proflab run`` and the API all call this.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from proflab.analysis.context import Context, tokens_as_steps
from proflab.errors import InputError, ProflabError, UnsupportedFormat, UsageError
from proflab.model import Trace
from proflab.readers import load_trace
from proflab.readers.budget import DEFAULT_BUDGET
from proflab.report import Report
from proflab.report.assemble import report_for

__all__ = ["analyze", "placed"]


def analyze(trace: Trace | str | Path, *, top_kernels: int = 15, bare_step_ms: float | None = None, all_parts: bool = False,
            memory_budget: int | None = DEFAULT_BUDGET, cache: bool | None = None,
            on_part: Callable[[int, str], None] | None = None) -> Report:
    """Every analysis and rule over one trace (see ``proflab.analyze``)."""
    if all_parts and not isinstance(trace, Trace):
        if memory_budget is None:  # no budget: every event is read at once
            return analyze(load_trace(trace, cache=cache, memory_budget=None), top_kernels=top_kernels, bare_step_ms=bare_step_ms)
        from proflab.readers import load_parts
        from proflab.report.combine import report_in_parts

        return placed(lambda: report_in_parts(load_parts(trace, budget=memory_budget, cache=cache), top_kernels=top_kernels,
                                              bare_step_ms=bare_step_ms, on_part=on_part), str(trace))
    if not isinstance(trace, Trace):
        trace = load_trace(trace, cache=cache, memory_budget=memory_budget)
    return placed(lambda: report_for(tokens_as_steps(Context(trace, bare_step_ms=bare_step_ms)), top_kernels=top_kernels),
                  trace.meta.source or "trace")


def placed(analyse, source: str) -> Report:
    """``analyse()``, a failure to place the trace's events (a damaged clock) named as the
    trace's."""
    try:
        return analyse()
    except (InputError, UsageError):
        raise
    except ProflabError as e:  # a trace the analyses cannot place (a damaged clock): name it
        raise UnsupportedFormat(source, str(e)) from e
