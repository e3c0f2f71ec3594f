"""``measure_energy``: time and energy of a block of code on every GPU (Zeus-style).

::

    with proflab.measure_energy() as m:
        train_one_epoch()
    m.result.time_s, m.result.energy_j        # {gpu index: J}, m.result.total_energy_j

    @proflab.measure_energy()
    def step(batch): ...                      # step.measurements: one EnergyMeasurement per call

Energy is the NVML total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``) read at
entry and exit; time is ``time.perf_counter``. When torch is already imported and CUDA is
initialised, the GPU is synchronised at both ends so the block's queued kernels count
(torch is never imported here). A block shorter than ``min_s`` (default 0.103 s: the longest
interval between updates of the H100's counter, measured by polling it idle and under load,
``benchmarks/probe_energy_counter.py``) gets its time but no energy, with the reason. Without
NVML or a GPU the block still runs and is timed; ``energy_j`` is None and ``reason`` says why
(missing, not zero). ``stop()`` is safe to call twice.

Cost: one counter read per GPU at each end. On an H100 (driver 580) a read takes ~3.4 ms, so
each measured block costs ~7 ms (``benchmarks/bench_measure_energy.py``): about 3% of a
250 ms step, under 1% from ~0.7 s. For energy per step of shorter steps, ``proflab run``'s
monitor samples the counter off the training thread and attributes it afterwards.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EnergyMeasurement", "measure_energy", "MIN_SPAN_S"]

MIN_SPAN_S = 0.103


@dataclass(frozen=True)
class EnergyMeasurement:
    """One measured block: ``time_s`` (s), ``energy_j`` per NVML GPU index (J; None for a GPU
    whose counter is unsupported), ``total_energy_j`` (None when any is missing) and why."""

    time_s: float
    energy_j: dict[int, float | None] | None
    reason: str = ""
    devices: tuple[int, ...] = field(default_factory=tuple)

    @property
    def total_energy_j(self) -> float | None:
        if not self.energy_j or any(v is None for v in self.energy_j.values()):
            return None
        return sum(self.energy_j.values())

    @property
    def mean_power_w(self) -> float | None:
        e = self.total_energy_j
        return None if e is None or self.time_s <= 0 else e / self.time_s


def _sync() -> None:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception:  # a broken CUDA context must not break the measured program
        pass


class measure_energy:  # noqa: N801 - used as a function / decorator
    """Context manager and decorator measuring time (s) and GPU energy (J); see the module."""

    def __init__(self, devices: list[int] | None = None, *, min_s: float = MIN_SPAN_S, sync: bool = True) -> None:
        self._want = devices
        self.min_s = float(min_s)
        self.sync = sync
        self.result: EnergyMeasurement | None = None
        self.measurements: list[EnergyMeasurement] = []
        self._nvml = None
        self._handles: dict[int, Any] = {}
        self._e0: dict[int, int | None] = {}
        self._t0: float | None = None
        self._reason = ""

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> measure_energy:
        if self._t0 is not None:
            return self
        self._reason = ""
        self._open()
        if self.sync:
            _sync()
        self._e0 = {i: self._read(h) for i, h in self._handles.items()}
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> EnergyMeasurement | None:
        """End the measurement (first call) and release NVML; safe to call twice."""
        if self._t0 is not None:
            if self.sync:
                _sync()
            t = time.perf_counter() - self._t0
            e1 = {i: self._read(h) for i, h in self._handles.items()}
            self._t0 = None
            energy: dict[int, float | None] | None = None
            reason = self._reason
            if self._handles:
                if t < self.min_s:
                    reason = (f"the block took {t * 1e3:.1f} ms, shorter than the energy counter's resolution "
                              f"({self.min_s * 1e3:.0f} ms): no energy attributed")
                else:
                    energy = {i: None if self._e0.get(i) is None or e1[i] is None else (e1[i] - self._e0[i]) / 1000
                              for i in self._handles}
                    if any(v is None for v in energy.values()):
                        reason = "the energy counter is not supported on GPU(s) " + ", ".join(
                            str(i) for i, v in energy.items() if v is None)
            self.result = EnergyMeasurement(t, energy, reason, tuple(self._handles))
            self.measurements.append(self.result)
        self._close()
        return self.result

    def __enter__(self) -> measure_energy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            self.start()
            try:
                return fn(*args, **kwargs)
            finally:
                self.stop()

        wrapper.measurements = self.measurements  # type: ignore[attr-defined]
        wrapper.meter = self  # type: ignore[attr-defined]
        return wrapper

    # -- NVML -----------------------------------------------------------------------------------
    def _open(self) -> None:
        from proflab.collect.monitor import available

        a = available()
        if not a:
            self._reason = f"energy missing: {a.reason}"
            return
        import pynvml

        try:
            pynvml.nvmlInit()
        except Exception as e:
            self._reason = f"energy missing: NVML cannot start ({e})"
            return
        self._nvml = pynvml
        try:
            count = pynvml.nvmlDeviceGetCount()
            for i in self._want if self._want is not None else range(count):
                self._handles[i] = pynvml.nvmlDeviceGetHandleByIndex(i)
        except Exception as e:
            self._reason = f"energy missing: NVML cannot open the GPUs ({e})"
            self._handles = {}

    def _read(self, h) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h))  # mJ
        except Exception:
            return None

    def _close(self) -> None:
        pynvml, self._nvml = self._nvml, None
        self._handles = {}
        if pynvml is not None:
            try:
                pynvml.nvmlShutdown()
            except Exception:
                pass
