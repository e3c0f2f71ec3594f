"""proflab.measure_energy on a machine without a GPU (this suite's machines): the block runs
and is timed, energy is missing with the reason, never zero; teardown is safe twice. The
GPU path is exercised by tests/gpu/test_measure_energy_gpu.py on a GPU machine."""

from __future__ import annotations

import time

import pytest

import proflab
from proflab.collect.monitor import available

pytestmark = pytest.mark.skipif(bool(available()), reason="this machine has a GPU: the GPU test covers it")


def test_context_manager_without_gpu_times_and_says_energy_is_missing():
    with proflab.measure_energy() as m:
        time.sleep(0.02)
    r = m.result
    assert r.time_s >= 0.02
    assert r.energy_j is None and r.total_energy_j is None and r.mean_power_w is None
    assert r.reason.startswith("energy missing:")
    assert m.stop() is r  # safe twice, same result
    m.stop()


def test_decorator_keeps_one_measurement_per_call_and_passes_errors_through():
    @proflab.measure_energy()
    def work(x):
        if x < 0:
            raise ValueError("negative")
        return x * 2

    assert work(3) == 6 and work(4) == 8
    with pytest.raises(ValueError):
        work(-1)
    assert len(work.measurements) == 3
    assert all(m.energy_j is None and m.reason for m in work.measurements)
