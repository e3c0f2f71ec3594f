"""Collection: what runs a program and records it. Produces files that the readers read.

::

    monitor.py         GPUMonitor: NVML (and GPM on Hopper+) sampling in a thread -> monitor.parquet
    torch_profiler.py  torch.profiler sessions: activities, schedules, trace export
    _child.py          the runtime ``proflab run`` starts inside the profiled process
    _bootstrap/        the sitecustomize.py that loads _child.py (stdlib only)
    nsys.py            Nsight Systems: availability, the profile argv, the SQLite export
    rundir.py          run directories: layout, meta.json, atomic writes, listing past runs
    launcher.py        ``proflab run``: spawn, forward signals, finalize, analyse
    api.py             annotate, capture, step, profile: the instrumentation API
    timing.py          auto_profile: CUDA-event (or perf_counter) timing of a call
    events.py          DetailedProfiler: a timestamped event log folded into the run
    callbacks.py       ProfCallback for PyTorch Lightning and Hugging Face Trainer
    ncu.py             Nsight Compute on the hot kernels: the plan, the argv, the run, the export

Nothing here imports torch, polars or pynvml at import time: each backend loads its
dependency when it is used, and says why it cannot run through ``available()``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Availability"]


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here; ``reason`` says why not (empty when ``ok``)."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok
