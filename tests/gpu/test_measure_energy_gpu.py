"""proflab.measure_energy on a real GPU (the GPU machine; skipped elsewhere): the block's
energy from the background reader agrees with NVML's counter read directly at the block's
ends and with the GPU monitor over the same load; every step wrapped adds up to the counter
over the loop; a block under the counter's resolution gets no energy; a forked child measures
with its own reader."""

from __future__ import annotations

import json
import os
import time
import warnings

import pytest

import proflab
from proflab.collect import measure

pytestmark = pytest.mark.gpu

# Tolerance against the counter read directly at a block's ends: a direct read returns the
# value of the counter's last update (up to one update interval, <= 0.103 s, late at each end)
# and the reader places an update within a few ms; so the two differ by at most the energy of
# one update interval at each end: 2 x 0.103 s x the block's mean power (+ 1 %).
def _tolerance_j(mean_power_w: float) -> float:
    return 2 * measure.MIN_SPAN_S * mean_power_w


def test_measure_energy_of_a_matmul_loop_against_the_monitor(busy_gpu):
    import torch

    torch.cuda.init()
    with proflab.GPUMonitor(period_s=0.1, devices=[0]) as mon:
        with proflab.measure_energy(devices=[0]) as m:
            busy_gpu(4.0)
    r = m.result
    d = mon.summary().devices[0]
    print(json.dumps({"time_s": r.time_s, "energy_j": r.energy_j, "mean_power_w": r.mean_power_w, "basis": r.basis,
                      "monitor_energy_j": d.energy_j, "monitor_duration_s": mon.duration_s}))
    assert r.time_s >= 4.0 and r.energy_j[0] is not None
    assert r.mean_power_w > 150  # a bf16 GEMM loop draws well above idle
    # the block sits inside the monitored span: its energy is at most the monitor's, and most of it
    assert 0.8 * d.energy_j <= r.energy_j[0] <= d.energy_j * 1.02
    m.stop()


def test_a_long_block_against_the_counter_read_directly_at_its_ends(busy_gpu):
    import pynvml
    import torch

    torch.cuda.init()
    busy_gpu(0.5)
    with proflab.measure_energy(devices=[0]):  # the reader has seen updates: interpolation
        time.sleep(0.3)
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    try:
        with proflab.measure_energy(devices=[0]) as m:
            d0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
            busy_gpu(3.0)
            torch.cuda.synchronize()
            d1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    finally:
        pynvml.nvmlShutdown()
    r = m.result
    direct = (d1 - d0) / 1000
    print(json.dumps({"time_s": r.time_s, "energy_j": r.energy_j[0], "basis": r.basis, "direct_j": direct,
                      "diff_pct": 100 * (r.energy_j[0] / direct - 1), "tolerance_j": _tolerance_j(r.mean_power_w)}))
    assert r.basis == "interpolated"
    assert abs(r.energy_j[0] - direct) <= _tolerance_j(r.mean_power_w) + 0.01 * direct


def test_every_step_wrapped_adds_up_to_the_counter_over_the_loop():
    import pynvml
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    @proflab.measure_energy(devices=[0])
    def step():
        for _ in range(100):  # ~0.16 s of bf16 GEMMs on an H100 (1.1 TFLOP each at ~680 TFLOP/s)
            torch.mm(a, a)
        torch.cuda.synchronize()

    step()
    time.sleep(0.25)  # the reader has seen updates
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    try:
        d0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
        t0 = time.perf_counter()
        for _ in range(20):
            step()
        t = time.perf_counter() - t0
        d1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    finally:
        pynvml.nvmlShutdown()
    ms = step.measurements[1:]
    got = [m.energy_j[0] if m.energy_j else None for m in ms]
    reasons = {m.reason for m in ms if m.energy_j is None}
    print(json.dumps({"step_ms": [round(m.time_s * 1e3, 1) for m in ms], "energy_j": got, "direct_j": (d1 - d0) / 1000,
                      "loop_s": t, "reasons": sorted(reasons)}))
    full = [m for m in ms if m.time_s >= measure.MIN_SPAN_S]
    assert len(full) >= 15, reasons  # a step under the floor gets no energy and says why
    assert all(m.basis == "interpolated" for m in full)
    if len(full) == len(ms):  # the steps cover the loop: their sum is the counter's over it
        total = sum(got)
        direct = (d1 - d0) / 1000
        assert abs(total - direct) <= _tolerance_j(direct / t) + 0.02 * direct, (total, direct)


def test_a_block_under_the_resolution_gets_no_energy():
    with proflab.measure_energy(devices=[0]) as m:
        time.sleep(0.01)
    assert m.result.energy_j is None and "resolution" in m.result.reason


def test_a_forked_child_measures_with_its_own_reader():
    with proflab.measure_energy(devices=[0]) as m:
        time.sleep(0.2)
    rfd, wfd = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork() of a threaded process
        pid = os.fork()
    if pid == 0:  # the child: never returns into pytest; no CUDA here, only NVML
        code = 1
        try:
            c = proflab.measure_energy(devices=[0], sync=False)
            with c:
                time.sleep(0.3)
            with c:
                time.sleep(0.3)
            r = c.result
            os.write(wfd, json.dumps({"energy_j": r.energy_j, "reason": r.reason, "basis": r.basis,
                                      "power_w": r.mean_power_w}).encode())
            code = 0
        except BaseException:
            import traceback

            os.write(wfd, traceback.format_exc().encode())
        finally:
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd) as f:
        got = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, got
    child = json.loads(got)
    print(got)
    assert child["energy_j"]["0"] > 0 and 20 < child["power_w"] < 1200, child
    assert m.result.energy_j[0] > 0
    with proflab.measure_energy(devices=[0]) as m2:  # the parent's reader goes on
        time.sleep(0.2)
    assert m2.result.energy_j[0] > 0
