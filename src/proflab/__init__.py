"""proflab: from "it is slow" to why, what to change and how much it saves.

Public API (everything else is internal)::

    trace = proflab.load("run.pt.trace.json.gz")   # columnar Trace (polars tables)
    report = proflab.analyze(trace)                  # Report: summary, findings, kernels
    report.to_dict()                                 # the proflab.report/1 JSON contract

Heavy dependencies (polars, numpy, msgspec) load on first use, so ``import proflab`` and
``proflab --help`` stay instant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "load",
    "analyze",
    "Trace",
    "Report",
    "Finding",
    "Missing",
    "ProflabError",
]

if TYPE_CHECKING:  # pragma: no cover
    from proflab.api import analyze, load
    from proflab.errors import ProflabError
    from proflab.model import Trace
    from proflab.report import Finding, Missing, Report

_LAZY = {
    "load": ("proflab.api", "load"),
    "analyze": ("proflab.api", "analyze"),
    "Trace": ("proflab.model", "Trace"),
    "Report": ("proflab.report", "Report"),
    "Finding": ("proflab.report", "Finding"),
    "Missing": ("proflab.report", "Missing"),
    "ProflabError": ("proflab.errors", "ProflabError"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'proflab' has no attribute {name!r}")
