"""``measure_energy``: time and energy of a block of code on every GPU (Zeus-style).

::

    with proflab.measure_energy() as m:
        train_one_epoch()
    m.result.time_s, m.result.energy_j        # {gpu index: J}, m.result.total_energy_j

    @proflab.measure_energy()
    def step(batch): ...                      # step.measurements: one EnergyMeasurement per call

Energy comes from the NVML total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``); time
is ``time.perf_counter``. When torch is already imported and CUDA is initialised, the GPU is
synchronised at both ends so the block's queued kernels count (torch is never imported here).

**How it stays cheap.** A counter read takes ~3.4 ms on an H100 (driver 580), so the counter is
not read at the block's ends. One daemon thread per process (the *reader*, shared by every
``measure_energy``, started by the first ``start()``) reads the counter of the devices in use
every ``POLL_S`` (0.01 s), well under the counter's update interval (100 ms on the H100,
``COUNTER_UPDATE_S`` in ``analysis/energy.py``), and keeps when each update happened (the
midpoint between the last read with the old value and the first with the new one; within
about half a read period) and its value. ``start()`` and ``stop()`` only take a timestamp
(plus the optional synchronise). The first ``start()`` of a reader also reads the counter
once itself (one read per device, once).

**How a block's energy is resolved**, lazily, the first time ``energy_j``/``reason`` is asked:

- a block shorter than ``min_s`` (default 0.103 s: the longest interval between updates of the
  H100's counter, measured by polling it idle and under load, ``benchmarks/probe_energy_counter.py``)
  gets its time but no energy, with the reason, at once;
- otherwise the energy is the counter's value interpolated linearly between the two updates
  around each end (``basis == "interpolated"``). It needs the counter's first update after the
  block's end, so asking right after the block may wait up to one update interval (~0.1 s;
  at most ``WAIT_S``); ``result.ready`` says whether it would wait;
- a block that began before the reader saw any update (the first block after the reader
  started) gets the difference of the counter's values at its two ends, what reading the
  counter there gives (``basis == "read"``; late by up to one update interval at each end);
- without NVML or a GPU the block still runs and is timed; ``energy_j`` is None and
  ``reason`` says why (missing, not zero); a GPU without the counter gets None and its index
  in ``reason``.

**Lifetime.** ``stop()`` is safe to call twice. The reader's thread ends by itself when no block
is open, every closed block's end is covered by a counter update, and nothing was measured for
``LINGER_S`` (2 s); the next ``start()`` starts a new one. It is stopped at interpreter exit
(and by :func:`shutdown`, also safe twice). Under ``os.fork`` no counter read is in flight
while the process forks (the fork waits for the read in progress); the child starts its own
reader when it measures, and blocks of the parent resolve from what was read before the fork.

Cost (``benchmarks/bench_measure_energy.py``, every step of a 41 us loop wrapped, on an H200):
~16 us per block (start plus stop, with the synchronise), where reading the counter at both
ends cost ~9.3 ms (a read takes ~4.7 ms there, ~3.4 ms on an H100); the reader's own reads
leave the bare loop's speed as it was (NVML's calls release the GIL). Resolving a block costs
~4 us, when its energy is first asked for.
"""

from __future__ import annotations

import atexit
import bisect
import functools
import os
import sys
import threading
import time
from array import array
from typing import Any

__all__ = ["EnergyMeasurement", "measure_energy", "shutdown", "MIN_SPAN_S", "POLL_S", "WAIT_S", "LINGER_S"]

MIN_SPAN_S = 0.103  # the H100 counter's longest update interval (analysis/energy.py COUNTER_UPDATE_S)
POLL_S = 0.01  # the reader's pause between two rounds of reads
WAIT_S = 1.0  # the longest a result waits for the counter's first update after its block
LINGER_S = 2.0  # the reader's thread ends after this long with nothing to measure
MAX_UPDATES = 400_000  # updates kept per device (~11 h at 10 per second); older ones are dropped

_clock = time.perf_counter


class EnergyMeasurement:
    """One measured block: ``time_s`` (s), ``energy_j`` per NVML GPU index (J; None for a GPU
    whose counter is unsupported), ``total_energy_j`` (None when any is missing), ``reason``
    (why energy is missing; empty otherwise) and ``basis`` (``"interpolated"`` or ``"read"``,
    see the module). ``energy_j``, ``reason`` and ``basis`` are resolved on first use."""

    __slots__ = ("time_s", "devices", "_energy", "_reason", "_basis", "_src")

    def __init__(self, time_s: float, energy_j: dict[int, float | None] | None = None, reason: str = "",
                 devices: tuple[int, ...] = ()) -> None:
        self.time_s = time_s
        self.devices = tuple(devices)
        self._energy = energy_j
        self._reason = reason
        self._basis: str | None = None
        self._src: tuple[_Reader, float, float] | None = None

    @classmethod
    def _pending(cls, time_s: float, devices: tuple[int, ...], reader: _Reader, t0: float, t1: float) -> EnergyMeasurement:
        m = cls(time_s, None, "", devices)
        m._src = (reader, t0, t1)
        return m

    def _resolve(self, wait: bool = True) -> bool:
        src = self._src
        if src is None:
            return True
        reader, t0, t1 = src
        out = reader.resolve(self.devices, t0, t1, wait)
        if out is None:
            return False
        self._energy, self._reason, self._basis = out
        self._src = None
        return True

    @property
    def energy_j(self) -> dict[int, float | None] | None:
        self._resolve()
        return self._energy

    @property
    def reason(self) -> str:
        self._resolve()
        return self._reason

    @property
    def basis(self) -> str | None:
        self._resolve()
        return self._basis

    @property
    def ready(self) -> bool:
        """Whether ``energy_j`` is known now, without waiting for the counter's next update."""
        return self._resolve(wait=False)

    @property
    def total_energy_j(self) -> float | None:
        e = self.energy_j
        if not e or any(v is None for v in e.values()):
            return None
        return sum(e.values())  # type: ignore[arg-type]

    @property
    def mean_power_w(self) -> float | None:
        e = self.total_energy_j
        return None if e is None or self.time_s <= 0 else e / self.time_s

    def _key(self) -> tuple:
        return self.time_s, self.energy_j, self.reason, self.devices

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EnergyMeasurement) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"EnergyMeasurement(time_s={self.time_s!r}, energy_j={self.energy_j!r}, reason={self.reason!r}, "
                f"devices={self.devices!r}, basis={self.basis!r})")


# -- the counter reader ---------------------------------------------------------------------------
class _Track:
    """One device's counter as the reader saw it: the first read (its value stands for the
    counter until the first update seen), then every update: when it happened (midpoint of the
    last read with the old value and the first read with the new one) and the new value (mJ).
    Appended by the reader's thread only (values before times, so a reader of ``ut`` finds its
    value); dropped from the front (under the reader's lock) beyond ``MAX_UPDATES``."""

    __slots__ = ("first_b", "first_v", "ut", "uv", "last_a", "last_mid", "last_v", "unsupported", "dropped")

    def __init__(self, a: float, b: float, v: int | None) -> None:
        self.first_b, self.first_v = b, v
        self.ut, self.uv = array("d"), array("d")
        self.last_a, self.last_mid, self.last_v = a, (a + b) / 2, v
        self.unsupported = v is None
        self.dropped = False

    def add(self, a: float, b: float, v: int) -> bool:
        mid = (a + b) / 2
        changed = v != self.last_v
        if changed:
            self.uv.append(v)
            self.ut.append((self.last_mid + mid) / 2)
            self.last_v = v
        self.last_a, self.last_mid = a, mid
        return changed

    def interp(self, t: float, n: int) -> float | None:
        """The counter (mJ) at ``t`` interpolated between the updates around it, None outside."""
        ut, uv = self.ut, self.uv
        if n < 2 or t < ut[0] or t > ut[n - 1]:
            return None
        k = bisect.bisect_right(ut, t, 0, n)
        if k >= n:
            return uv[n - 1]
        t_a, t_b = ut[k - 1], ut[k]
        return uv[k - 1] + (uv[k] - uv[k - 1]) * (t - t_a) / (t_b - t_a)

    def value_at(self, t: float, n: int) -> float | None:
        """What a read of the counter at ``t`` would have returned (mJ): the last update's value,
        or the first read's; None when ``t`` precedes the first read or follows the last."""
        if t < self.first_b or t > self.last_a:
            return None
        k = bisect.bisect_right(self.ut, t, 0, n)
        if k == 0:
            return None if self.dropped else self.first_v
        return self.uv[k - 1]


class _Reader:
    """The process's counter reader: NVML handles, one ``_Track`` per device, and the thread."""

    def __init__(self, pynvml) -> None:
        self.nvml = pynvml
        self.lock = threading.Lock()  # active/last_end/retired, track pruning, resolution
        self.cond = threading.Condition(self.lock)
        self.read_lock = threading.Lock()  # held around each NVML call; a fork waits for it
        self.handles: dict[int, Any] = {}
        self.tracks: dict[int, _Track] = {}
        self.all_devices: tuple[int, ...] | None = None
        self.active = 0
        self.last_end = _clock()
        self.waiters = 0
        self.retired = False
        self.forked = False
        self.stop_evt = threading.Event()
        self.thread: threading.Thread | None = None

    # -- reads ----------------------------------------------------------------------------------
    def _read(self, h) -> tuple[float, float, int | None] | None:
        """One counter read: (start, end, mJ); mJ None when unsupported; None on another error."""
        nvml = self.nvml
        with self.read_lock:
            a = _clock()
            try:
                v: int | None = int(nvml.nvmlDeviceGetTotalEnergyConsumption(h))
            except nvml.NVMLError as e:
                if getattr(e, "value", None) != getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3):
                    return None
                v = None
            except Exception:
                return None
            b = _clock()
        return a, b, v

    def open(self, want: list[int] | None) -> None:
        """Handles for the devices (all when ``want`` is None), each read once now; raises on
        an NVML error (no such GPU, no permission)."""
        nvml = self.nvml
        if want is None:
            idx = list(range(nvml.nvmlDeviceGetCount()))
        else:
            idx = list(want)
        new = {i: nvml.nvmlDeviceGetHandleByIndex(i) for i in idx if i not in self.handles}
        for i, h in new.items():
            r = self._read(h)
            if r is None:  # one retry: a transient error must not leave the device unread
                r = self._read(h)
            a, b, v = r if r is not None else (_clock(), _clock(), None)
            self.tracks[i] = _Track(a, b, v)
            self.handles[i] = h  # after its track: the thread iterates the handles
        if want is None:
            self.all_devices = tuple(idx)

    def _run(self) -> None:
        tracks, stop = self.tracks, self.stop_evt
        try:
            while not stop.is_set():
                changed = False
                for i, h in list(self.handles.items()):
                    tr = tracks[i]
                    if tr.unsupported:
                        continue
                    r = self._read(h)
                    if r is None:
                        continue
                    if r[2] is None:
                        tr.unsupported = True
                        continue
                    if tr.add(*r):  # type: ignore[arg-type]
                        changed = True
                        if len(tr.ut) > MAX_UPDATES:
                            with self.lock:
                                drop = len(tr.ut) - MAX_UPDATES // 2
                                del tr.uv[:drop]
                                del tr.ut[:drop]
                                tr.dropped = True
                if changed and self.waiters:
                    with self.cond:
                        self.cond.notify_all()
                if self.active == 0 and self._idle():
                    with self.lock:
                        if self.active == 0:
                            self.retired = True
                            break
                stop.wait(POLL_S)
        finally:
            with self.cond:
                self.retired = True
                self.cond.notify_all()
            if not self.forked:
                try:
                    self.nvml.nvmlShutdown()
                except Exception:
                    pass

    def _idle(self) -> bool:
        now = _clock()
        if now - self.last_end < LINGER_S:
            return False
        if now - self.last_end > WAIT_S + LINGER_S:
            return True
        return self._covered(tuple(self.tracks), self.last_end)

    def _covered(self, devices: tuple[int, ...], t: float) -> bool:
        for i in devices:
            tr = self.tracks[i]
            if not tr.unsupported and not (len(tr.ut) and tr.ut[-1] > t):
                return False
        return True

    def start_thread(self) -> None:
        self.thread = threading.Thread(target=self._run, name="proflab-energy-reader", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.retired = True
            self.cond.notify_all()
        self.stop_evt.set()
        t = self.thread
        if t is not None and t is not threading.current_thread() and t.is_alive():
            t.join(timeout=1.0)

    # -- blocks ---------------------------------------------------------------------------------
    def release(self, t1: float) -> None:
        with self.lock:
            self.active -= 1
            if t1 > self.last_end:
                self.last_end = t1

    def resolve(self, devices: tuple[int, ...], t0: float, t1: float, wait: bool):
        """(energy_j, reason, basis) of the block [t0, t1]; None when not known yet and not
        ``wait``. Waits (at most until ``t1 + WAIT_S``) for the counter's update after ``t1``."""
        with self.cond:
            if not self.retired and not self._covered(devices, t1):
                if not wait:
                    if _clock() < t1 + WAIT_S:
                        return None
                else:
                    self.waiters += 1
                    try:
                        while not self.retired and not self._covered(devices, t1):
                            left = t1 + WAIT_S - _clock()
                            if left <= 0:
                                break
                            self.cond.wait(min(left, 0.05))
                    finally:
                        self.waiters -= 1
            return self._energy(devices, t0, t1)

    def _energy(self, devices: tuple[int, ...], t0: float, t1: float):
        tracks = {i: self.tracks[i] for i in devices}
        n = {i: len(tr.ut) for i, tr in tracks.items()}
        live = [i for i, tr in tracks.items() if not tr.unsupported]
        unsupported = [i for i, tr in tracks.items() if tr.unsupported]
        energy: dict[int, float | None] = {i: None for i in unsupported}
        ends = {i: (tracks[i].interp(t0, n[i]), tracks[i].interp(t1, n[i])) for i in live}
        basis = "interpolated"
        if any(e0 is None or e1 is None for e0, e1 in ends.values()):
            basis = "read"
            ends = {i: (tracks[i].value_at(t0, n[i]), tracks[i].value_at(t1, n[i])) for i in live}
        lost = [i for i, (e0, e1) in ends.items() if e0 is None or e1 is None]
        if lost:
            if any(tracks[i].dropped and n[i] and t0 < tracks[i].ut[0] for i in lost):
                why = "the counter's updates around the block were dropped (older than the reader keeps)"
            else:
                why = ("the counter was not read after the block's end (the reader stopped: shutdown(), "
                       "interpreter exit or a fork during the block)")
            return None, f"energy missing on GPU(s) {', '.join(map(str, lost))}: {why}", None
        back = [i for i, (e0, e1) in ends.items() if e1 < e0]
        if back:
            return None, f"energy missing on GPU(s) {', '.join(map(str, back))}: the counter went backwards (a driver reset?)", None
        for i, (e0, e1) in ends.items():
            energy[i] = (e1 - e0) / 1000
        reason = ""
        if unsupported:
            reason = "the energy counter is not supported on GPU(s) " + ", ".join(map(str, unsupported))
        return energy, reason, basis if live else None


_LOCK = threading.Lock()
_READER: _Reader | None = None
_MISSING: str | None = None  # why NVML cannot run in this process (it will not appear later)
_ATEXIT = False


def _load_nvml():
    """The pynvml module, initialised, or the reason it cannot be (a str)."""
    from proflab.collect.monitor import available

    a = available()
    if not a:
        return f"energy missing: {a.reason}"
    import pynvml

    try:
        pynvml.nvmlInit()
    except Exception as e:
        return f"energy missing: NVML cannot start ({e})"
    return pynvml


def _acquire(want: list[int] | None) -> tuple[_Reader | None, tuple[int, ...], str]:
    """The running reader with ``want``'s devices open and one more block counted in it."""
    r = _READER
    if r is not None:
        with r.lock:
            if not r.retired:
                devs = r.all_devices if want is None else tuple(want)
                if devs is not None and all(i in r.handles for i in devs):
                    r.active += 1
                    return r, devs, ""
    return _acquire_slow(want)


def _acquire_slow(want: list[int] | None) -> tuple[_Reader | None, tuple[int, ...], str]:
    global _READER, _MISSING, _ATEXIT
    with _LOCK:
        if _MISSING is not None:
            return None, (), _MISSING
        r = _READER
        if r is None or r.retired:
            nvml = _load_nvml()
            if isinstance(nvml, str):
                _MISSING = nvml
                return None, (), nvml
            r = _Reader(nvml)
            fresh = True
        else:
            fresh = False
        try:
            r.open(want)
        except Exception as e:
            if fresh:
                try:
                    r.nvml.nvmlShutdown()
                except Exception:
                    pass
            return None, (), f"energy missing: NVML cannot open the GPUs ({e})"
        if fresh:
            _READER = r
            if not _ATEXIT:
                atexit.register(shutdown)
                _ATEXIT = True
            r.start_thread()
        with r.lock:
            r.active += 1
        return r, (r.all_devices if want is None else tuple(want)), ""  # type: ignore[return-value]


def shutdown() -> None:
    """Stop the counter reader's thread now (also done at interpreter exit); safe to call twice.
    Blocks already closed keep what was read; a block still open gets no energy."""
    global _READER
    with _LOCK:
        r, _READER = _READER, None
    if r is not None:
        r.stop()


_FORK_HELD: threading.Lock | None = None


def _before_fork() -> None:
    global _FORK_HELD
    r = _READER
    if r is not None:
        r.read_lock.acquire()  # no NVML call in flight while the process forks
        _FORK_HELD = r.read_lock


def _after_fork_parent() -> None:
    global _FORK_HELD
    held, _FORK_HELD = _FORK_HELD, None
    if held is not None:
        held.release()


def _after_fork_child() -> None:
    global _LOCK, _READER, _FORK_HELD
    _LOCK = threading.Lock()
    _FORK_HELD = None
    r, _READER = _READER, None
    if r is not None:  # the thread did not come along: the reader is frozen as it was
        r.forked = r.retired = True
        r.lock = threading.Lock()
        r.cond = threading.Condition(r.lock)
        r.read_lock = threading.Lock()
        r.thread = None
        r.waiters = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child)


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
        self._want = None if devices is None else list(devices)
        self.min_s = float(min_s)
        self.sync = sync
        self.result: EnergyMeasurement | None = None
        self.measurements: list[EnergyMeasurement] = []
        self._reader: _Reader | None = None
        self._devices: tuple[int, ...] = ()
        self._t0: float | None = None
        self._reason = ""

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> measure_energy:
        if self._t0 is not None:
            return self
        self._reader, self._devices, self._reason = _acquire(self._want)
        if self.sync:
            _sync()
        self._t0 = _clock()
        return self

    def stop(self) -> EnergyMeasurement | None:
        """End the measurement (first call); safe to call twice (the second returns the same)."""
        if self._t0 is None:
            return self.result
        if self.sync:
            _sync()
        t1 = _clock()
        t0, self._t0 = self._t0, None
        r, self._reader = self._reader, None
        t = t1 - t0
        if r is None:
            res = EnergyMeasurement(t, None, self._reason, ())
        else:
            r.release(t1)
            if t < self.min_s:
                res = EnergyMeasurement(t, None, f"the block took {t * 1e3:.1f} ms, shorter than the energy counter's "
                                        f"resolution ({self.min_s * 1e3:.0f} ms): no energy attributed", self._devices)
            else:
                res = EnergyMeasurement._pending(t, self._devices, r, t0, t1)
        self.result = res
        self.measurements.append(res)
        return res

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
