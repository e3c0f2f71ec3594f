"""auto_profile: time a call the way a benchmark should (seed 004's ``easy_profiler``).

``warmup`` untimed calls first (CUDA context, cuBLAS handles, autotuning, caches), then
``iterations`` timed ones. With CUDA each call is timed between two CUDA events on the current
stream (GPU time, not launch time); without CUDA with ``time.perf_counter`` around the call,
and ``Timing.clock`` says which.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

__all__ = ["Timing", "auto_profile", "time_call"]


@dataclass(frozen=True)
class Timing:
    """Per-call times in ms over ``iterations`` calls; ``throughput_per_s`` is
    ``work_per_call`` / mean time, in ``unit`` per second (None without ``work_per_call``)."""

    name: str
    clock: str  # "cuda_event" or "perf_counter"
    warmup: int
    iterations: int
    mean_ms: float
    median_ms: float
    p95_ms: float
    stdev_ms: float
    min_ms: float
    max_ms: float
    throughput_per_s: float | None = None
    unit: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        s = (f"{self.name}: mean {self.mean_ms:.3f} ms, median {self.median_ms:.3f} ms, p95 {self.p95_ms:.3f} ms, "
             f"stdev {self.stdev_ms:.3f} ms over {self.iterations} calls ({self.clock})")  # fmt: skip
        if self.throughput_per_s is not None:
            s += f"; {self.throughput_per_s:,.1f} {self.unit or 'items'}/s"
        return s


def _p95(xs: list[float]) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * 0.95  # linear interpolation between closest ranks
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def time_call(fn: Callable, *args, warmup: int = 3, iterations: int = 10, work_per_call: float | None = None,
              unit: str | None = None, name: str | None = None, **kwargs) -> tuple[Timing, Any]:
    """Call ``fn(*args, **kwargs)`` ``warmup`` + ``iterations`` times; the Timing and the last result."""
    from proflab.errors import UsageError

    if warmup < 0 or iterations < 1:
        raise UsageError("auto_profile needs warmup >= 0 and iterations >= 1")
    torch = sys.modules.get("torch")
    cuda = torch is not None and torch.cuda.is_available()
    result = None
    for _ in range(warmup):
        result = fn(*args, **kwargs)
    times_ms: list[float] = []
    if cuda:
        torch.cuda.synchronize()
        pairs = []
        for _ in range(iterations):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = fn(*args, **kwargs)
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize()
        times_ms = [s.elapsed_time(e) for s, e in pairs]
    else:
        for _ in range(iterations):
            t0 = time.perf_counter()
            result = fn(*args, **kwargs)
            times_ms.append((time.perf_counter() - t0) * 1e3)
    mean = statistics.fmean(times_ms)
    timing = Timing(
        name=name or getattr(fn, "__qualname__", repr(fn)),
        clock="cuda_event" if cuda else "perf_counter",
        warmup=warmup,
        iterations=iterations,
        mean_ms=mean,
        median_ms=statistics.median(times_ms),
        p95_ms=_p95(times_ms),
        stdev_ms=statistics.stdev(times_ms) if len(times_ms) > 1 else 0.0,
        min_ms=min(times_ms),
        max_ms=max(times_ms),
        throughput_per_s=None if work_per_call is None or mean <= 0 else work_per_call / (mean / 1e3),
        unit=unit,
    )
    return timing, result


def auto_profile(fn: Callable | None = None, *, warmup: int = 3, iterations: int = 10,
                 work_per_call: float | None = None, unit: str | None = None, report: bool = True):
    """Decorator: each call of the function runs it ``warmup`` + ``iterations`` times, prints
    one line of timing to stderr (``report=False`` silences it), keeps it in
    ``wrapper.timing`` and returns the last call's result::

        @proflab.auto_profile(warmup=3, iterations=10, work_per_call=64, unit="samples")
        def train_step(batch): ...
    """

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            # The call is closed over, so that the function's own keyword arguments (a
            # ``name`` or ``warmup`` of its own) reach it rather than time_call.
            timing, result = time_call(lambda: f(*args, **kwargs), warmup=warmup, iterations=iterations,
                                       work_per_call=work_per_call, unit=unit, name=f.__qualname__)  # fmt: skip
            wrapper.timing = timing
            wrapper.timings.append(timing)
            if report:
                print(f"proflab: {timing}", file=sys.stderr)
            return result

        wrapper.timing = None
        wrapper.timings = []
        return wrapper

    return decorate(fn) if fn is not None else decorate
