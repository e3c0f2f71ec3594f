"""proflab.measure_energy on a real GPU (the GPU machine; skipped elsewhere): the block's
energy from NVML's counter agrees with the GPU monitor's counter over the same load, and a
block under the counter's resolution gets no energy."""

from __future__ import annotations

import json
import time

import pytest

import proflab

pytestmark = pytest.mark.gpu


def test_measure_energy_of_a_matmul_loop_against_the_monitor(busy_gpu):
    import torch

    torch.cuda.init()
    with proflab.GPUMonitor(period_s=0.1, devices=[0]) as mon:
        with proflab.measure_energy(devices=[0]) as m:
            busy_gpu(4.0)
    r = m.result
    d = mon.summary().devices[0]
    print(json.dumps({"time_s": r.time_s, "energy_j": r.energy_j, "mean_power_w": r.mean_power_w,
                      "monitor_energy_j": d.energy_j, "monitor_duration_s": mon.duration_s}))
    assert r.time_s >= 4.0 and r.energy_j[0] is not None
    assert r.mean_power_w > 150  # a bf16 GEMM loop draws well above idle
    # the block sits inside the monitored span: its energy is at most the monitor's, and most of it
    assert 0.8 * d.energy_j <= r.energy_j[0] <= d.energy_j * 1.02
    m.stop()


def test_a_block_under_the_resolution_gets_no_energy():
    with proflab.measure_energy(devices=[0]) as m:
        time.sleep(0.01)
    assert m.result.energy_j is None and "resolution" in m.result.reason
