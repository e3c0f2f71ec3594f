"""measure_energy's background counter reader, on this machine (no GPU, no NVIDIA driver).

NVML is MOCKED here, and only NVML: an NVIDIA energy counter cannot be produced without an
NVIDIA driver. ``FakeNVML`` is a counter that steps every ``update_s`` (as the H100's steps
every 100 ms) at a constant power, and whose reads take ``read_s`` (as the H100's take ~3.4 ms).
Everything else is real: the reader's thread, its timestamps, the interpolation, the lifetime,
a real ``os.fork``. The real NVML path is tests/gpu/test_measure_energy_gpu.py.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import warnings
from pathlib import Path

import pytest

import proflab
from proflab.collect import measure


class FakeNVML:
    """The part of pynvml the reader uses. Counter (mJ) of device i: power_w[i] x the time
    since creation, floored to the last multiple of ``update_s``."""

    NVML_ERROR_NOT_SUPPORTED = 3

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self, power_w=(300.0,), update_s=0.05, read_s=0.002, unsupported=()) -> None:
        self.power_w, self.update_s, self.read_s, self.unsupported = list(power_w), update_s, read_s, set(unsupported)
        self.base = time.perf_counter()
        self.inits = self.shutdowns = 0
        self.reads_by_thread: dict[int, int] = {}

    def nvmlInit(self):  # noqa: N802 - NVML's names
        self.inits += 1

    def nvmlShutdown(self):  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.power_w)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        if not 0 <= i < len(self.power_w):
            raise self.NVMLError(2)
        return i

    def counter_mj(self, h: int, t: float) -> int:
        k = math.floor((t - self.base) / self.update_s)
        return int(round(self.power_w[h] * k * self.update_s * 1000))

    def nvmlDeviceGetTotalEnergyConsumption(self, h):  # noqa: N802
        tid = threading.get_ident()
        self.reads_by_thread[tid] = self.reads_by_thread.get(tid, 0) + 1
        if h in self.unsupported:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        time.sleep(self.read_s / 2)
        v = self.counter_mj(h, time.perf_counter())
        time.sleep(self.read_s / 2)
        return v


@pytest.fixture
def fake(monkeypatch):
    made: list[FakeNVML] = []

    def install(**kw) -> FakeNVML:
        nv = FakeNVML(**kw)
        made.append(nv)

        def load():
            nv.nvmlInit()
            return nv

        monkeypatch.setattr(measure, "_load_nvml", load)
        return nv

    measure.shutdown()
    monkeypatch.setattr(measure, "_MISSING", None)
    monkeypatch.setattr(measure, "POLL_S", 0.002)
    yield install
    measure.shutdown()


def _reader_thread() -> threading.Thread | None:
    r = measure._READER
    return None if r is None else r.thread


def test_a_warm_reader_interpolates_each_block_to_power_times_time(fake):
    nv = fake(power_w=(300.0,), update_s=0.05)
    meter = proflab.measure_energy(min_s=0.1)
    with meter:  # the first block after the reader started: counter values at its ends
        time.sleep(0.12)
    first = meter.result
    assert first.basis == "read" and first.energy_j[0] is not None
    assert first.energy_j[0] % (300 * 0.05) == pytest.approx(0, abs=1e-6)  # whole counter steps only
    results = []
    for _ in range(3):
        with meter:
            time.sleep(0.2)
        results.append(meter.result)
    for r in results:
        assert r.basis == "interpolated" and r.reason == ""
        # exact for a constant power but for when each update happened: known within a read
        # period (2 ms poll + 2 ms read here; 20 ms allowed for a busy machine's scheduling)
        assert r.energy_j[0] == pytest.approx(300 * r.time_s, abs=300 * 0.02)
        assert r.mean_power_w == pytest.approx(300, rel=0.1)
    assert len(meter.measurements) == 4 and nv.inits == 1


def test_start_and_stop_never_read_the_counter_on_the_measured_thread(fake):
    nv = fake(power_w=(250.0, 400.0), update_s=0.02)
    me = threading.get_ident()

    @proflab.measure_energy(min_s=0.0)
    def step():
        time.sleep(0.0005)

    step()  # the reader starts: one read per device on this thread, once
    assert nv.reads_by_thread.get(me) == 2
    for _ in range(300):
        step()
    assert nv.reads_by_thread.get(me) == 2  # 300 more blocks, no read here
    assert sum(v for t, v in nv.reads_by_thread.items() if t != me) > 0  # the reader's thread did
    time.sleep(0.05)
    # each ~0.6 ms block lies between two updates 20 ms apart, whose times are known within a
    # few ms: one block's energy is that far off (why the floor exists), but the blocks are
    # back to back, so their sum is the counter's over all of them, each GPU at its power
    bases = [m.basis for m in step.measurements]
    # read at both ends until the reader has seen an update (on a loaded machine one block can
    # outlast an update, and then even the first is interpolated), interpolated after it
    k = bases.index("interpolated")
    assert set(bases[:k]) <= {"read"} and set(bases[k:]) == {"interpolated"}
    ms = step.measurements[k:]
    assert len(ms) > 200
    span = sum(m.time_s for m in ms)
    for i, p in ((0, 250.0), (1, 400.0)):
        assert sum(m.energy_j[i] for m in ms) == pytest.approx(p * span, rel=0.1)


def test_a_block_under_the_floor_gets_no_energy_at_once(fake):
    fake()
    with proflab.measure_energy() as m:
        time.sleep(0.01)
    assert m.result.ready and m.result.energy_j is None and "resolution" in m.result.reason


def test_a_gpu_without_the_counter_is_missing_not_zero(fake):
    fake(power_w=(300.0, 300.0), unsupported={1})
    with proflab.measure_energy(min_s=0.05) as m:
        time.sleep(0.08)
    r = m.result
    assert r.energy_j[0] > 0 and r.energy_j[1] is None and r.total_energy_j is None
    assert "not supported on GPU(s) 1" in r.reason


def test_a_gpu_nvml_cannot_open_is_stated(fake):
    fake(power_w=(300.0,))
    with proflab.measure_energy(devices=[3]) as m:
        pass
    assert m.result.energy_j is None and m.result.reason.startswith("energy missing: NVML cannot open the GPUs")


def test_the_result_waits_for_the_counters_next_update(fake):
    fake(update_s=0.1)
    meter = proflab.measure_energy(min_s=0.05)
    with meter:
        time.sleep(0.06)
    with meter:
        time.sleep(0.11)  # after >= 1 update: a warm reader
    t = time.perf_counter()
    e = meter.result.energy_j
    waited = time.perf_counter() - t
    assert e[0] is not None and meter.result.ready
    assert waited < measure.WAIT_S  # at most one update interval (0.1 s) plus a read, here


def test_teardown_is_safe_twice_and_the_thread_ends_when_nothing_is_measured(fake, monkeypatch):
    nv = fake(update_s=0.02)
    monkeypatch.setattr(measure, "LINGER_S", 0.1)
    meter = proflab.measure_energy(min_s=0.03)
    meter.start()
    th = _reader_thread()
    assert th is not None and th.is_alive() and th.daemon
    time.sleep(0.05)
    r = meter.stop()
    assert meter.stop() is r and meter.stop() is r  # safe twice
    th.join(timeout=5)  # no open block, its end covered by an update, 0.1 s idle
    assert not th.is_alive() and nv.shutdowns == nv.inits == 1
    assert r.energy_j[0] > 0  # resolved from what the stopped reader kept
    with meter:  # the next block starts a new reader
        time.sleep(0.04)
    assert _reader_thread() is not th and _reader_thread().is_alive() and nv.inits == 2
    assert meter.result.energy_j[0] > 0
    measure.shutdown()
    measure.shutdown()  # safe twice
    assert measure._READER is None and nv.shutdowns == 2


def test_a_block_open_at_shutdown_says_why_it_has_no_energy(fake):
    fake(update_s=0.02)
    meter = proflab.measure_energy(min_s=0.0)
    meter.start()
    time.sleep(0.01)
    measure.shutdown()
    time.sleep(0.05)
    r = meter.stop()
    assert r.energy_j is None and "not read after the block's end" in r.reason


def test_old_updates_beyond_the_cap_are_dropped_and_said(fake, monkeypatch):
    fake(update_s=0.005)
    monkeypatch.setattr(measure, "MAX_UPDATES", 40)  # 20-40 updates kept: 0.1-0.2 s
    meter = proflab.measure_energy(min_s=0.0)
    with meter:
        time.sleep(0.02)
    with meter:
        time.sleep(0.02)
    old = meter.result
    time.sleep(0.6)  # 120 updates: the cap drops those around the old block
    with meter:
        time.sleep(0.02)
    assert old.energy_j is None and "dropped" in old.reason
    assert meter.result.energy_j[0] > 0 and meter.result.basis == "interpolated"


def test_under_fork_the_child_measures_with_its_own_reader_and_the_parent_goes_on(fake):
    nv = fake(update_s=0.02)
    meter = proflab.measure_energy(min_s=0.03)
    with meter:
        time.sleep(0.05)
    parent_thread = _reader_thread()
    time.sleep(0.1)  # the counter updates after the block (not resolved: the child resolves it)
    assert meter.result._src is not None
    rfd, wfd = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork() of a threaded process
        pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            child = proflab.measure_energy(min_s=0.03)
            with child:
                time.sleep(0.05)
            with child:
                time.sleep(0.05)
            r = child.result
            os.write(wfd, json.dumps({"energy": r.energy_j[0], "time": r.time_s, "basis": r.basis,
                                      "new_thread": _reader_thread() is not None and _reader_thread().is_alive(),
                                      "parent_block": meter.result.energy_j[0]}).encode())
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
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, got
    child = json.loads(got)
    assert child["new_thread"] and child["energy"] == pytest.approx(300 * child["time"], abs=300 * 0.02)
    assert child["basis"] == "interpolated"
    assert child["parent_block"] > 0  # the parent's block resolved in the child from what was read
    assert parent_thread.is_alive() and not parent_thread.ident is None
    with meter:
        time.sleep(0.05)
    assert meter.result.energy_j[0] == pytest.approx(300 * meter.result.time_s, abs=300 * 0.02)
    assert nv.inits == 1  # the parent kept its reader


def test_the_recorded_cost_per_block_before_and_after_the_reader():
    # benchmarks/bench_measure_energy.py on an H200 (tests/data/energy/bench_measure_energy_h200.json):
    # every step of a 41 us loop wrapped. Before: two counter reads per block (~4.7 ms each on
    # that driver); after: timestamps only, under the 0.1 ms per step the issue asks for, and
    # the reader's own reads leave the bare loop as it was.
    rec = json.loads((Path(__file__).parents[1] / "data" / "energy" / "bench_measure_energy_h200.json").read_text())
    assert rec["before_default_cost_per_block_us"] > rec["energy_read_us"] * 1.5
    assert rec["after_default_cost_per_block_us"] < 100 and rec["after_min0_cost_per_block_us"] < 100
    assert rec["before_default_cost_per_block_us"] / rec["after_default_cost_per_block_us"] > 100
    assert rec["bare_reader_running_ratio"] < 1.05
    assert rec["check_block"]["basis"] == "interpolated" and rec["check_block"]["energy_j"]["0"] > 0
    iv = rec["counter_update_interval_ms"]
    assert iv["median"] == pytest.approx(100, abs=3)  # the H200's counter steps every ~100 ms too
