"""proflab: from "it is slow" to why, what to change and how much it saves.

Public API (everything else is internal)::

    trace = proflab.load("run.pt.trace.json.gz")   # columnar Trace (polars tables)
    report = proflab.analyze(trace)                  # Report: summary, findings, kernels
    report.to_dict()                                 # the proflab.report/1 JSON contract
    proflab.compare("before/", "after/")             # Comparison: verdict, tables (polars)
    proflab.energy("proflab-runs/RUN")               # energy per GPU / window / step, power & thermal findings

    with proflab.profile("train", wait=2, active=5) as run:   # a run directory, analysed
        for batch in data:
            with proflab.annotate("forward"): ...    # NVTX range + record_function
            proflab.step()                           # advances the step window
    with proflab.GPUMonitor() as mon: ...            # NVML power, energy, clocks, GPM
    with proflab.measure_energy() as m: ...          # time (s) and energy (J) of a block, every GPU
    proflab.auto_profile, proflab.capture, proflab.record, proflab.DetailedProfiler,
    proflab.ProfCallback (Lightning / Hugging Face Trainer)

``proflab run -- python train.py`` profiles a program with no code changes; inside it these
calls reach the run.

Heavy dependencies (polars, numpy, msgspec) load on first use, so ``import proflab`` and
``proflab --help`` stay instant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proflab._version import __version__

__all__ = [
    "__version__",
    "load",
    "analyze",
    "compare",
    "energy",
    "Trace",
    "Report",
    "Finding",
    "Missing",
    "ProflabError",
    "annotate",
    "capture",
    "step",
    "record",
    "profile",
    "GPUMonitor",
    "measure_energy",
    "auto_profile",
    "DetailedProfiler",
    "ProfCallback",
]

if TYPE_CHECKING:  # pragma: no cover
    from proflab.api import analyze, compare, energy, load
    from proflab.collect.api import annotate, capture, profile, record, step
    from proflab.collect.callbacks import ProfCallback
    from proflab.collect.events import DetailedProfiler
    from proflab.collect.measure import measure_energy
    from proflab.collect.monitor import GPUMonitor
    from proflab.collect.timing import auto_profile
    from proflab.errors import ProflabError
    from proflab.model import Trace
    from proflab.report import Finding, Missing, Report

_LAZY = {
    "load": ("proflab.api", "load"),
    "analyze": ("proflab.api", "analyze"),
    "compare": ("proflab.api", "compare"),
    "energy": ("proflab.api", "energy"),
    "Trace": ("proflab.model", "Trace"),
    "Report": ("proflab.report", "Report"),
    "Finding": ("proflab.report", "Finding"),
    "Missing": ("proflab.report", "Missing"),
    "ProflabError": ("proflab.errors", "ProflabError"),
    "annotate": ("proflab.collect.api", "annotate"),
    "capture": ("proflab.collect.api", "capture"),
    "step": ("proflab.collect.api", "step"),
    "record": ("proflab.collect.api", "record"),
    "profile": ("proflab.collect.api", "profile"),
    "GPUMonitor": ("proflab.collect.monitor", "GPUMonitor"),
    "measure_energy": ("proflab.collect.measure", "measure_energy"),
    "auto_profile": ("proflab.collect.timing", "auto_profile"),
    "DetailedProfiler": ("proflab.collect.events", "DetailedProfiler"),
    "ProfCallback": ("proflab.collect.callbacks", "ProfCallback"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'proflab' has no attribute {name!r}")
