"""Where an analysis spends its time and memory, phase by phase (``proflab analyze --timings``).

The pipeline marks its phases (``with phase("what-if"):``); nothing is measured unless a
:func:`recording` is open, so a mark costs one global read otherwise. Phases nest as a stack:
the time of a phase opened inside another (the what-if, asked for by the rules) is its own,
not the outer one's, so the phases add up to the analysis.

Each phase's peak memory is the largest resident set seen while it ran: exact where the
process's own peak (``VmHWM``) rose during the phase (the peak was then reached in it), else
the largest of samples taken every ``SAMPLE_S`` by a thread (a spike shorter than that can
be missed). The process's peak is never reset (``/proc/self/clear_refs`` would also change
what ``getrusage`` and a parent's ``wait4`` report, which the benchmarks read). Outside
Linux no memory is read: time only.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

__all__ = ["Timings", "phase", "recording", "PHASES"]

PHASES = ("decode", "tables", "timeline", "what-if", "memory", "rules", "render")  # (the order they are printed in)
SAMPLE_S = 0.005
_PAGE = 4096


@dataclass
class Timings:
    """Per phase: wall seconds (``wall_s``) and peak resident bytes (``peak_bytes``, None where
    memory cannot be read), with the whole recording's (``total_s``, ``peak_total_bytes``: the
    largest of its stretches', what no phase claimed included; ``peak_other_bytes``: of that)."""

    wall_s: dict[str, float] = field(default_factory=dict)
    peak_bytes: dict[str, int | None] = field(default_factory=dict)
    total_s: float = 0.0
    peak_total_bytes: int | None = None
    peak_other_bytes: int | None = None

    def rows(self) -> list[tuple[str, float, int | None]]:
        """(phase, wall s, peak bytes) in pipeline order, the phases not run left out, and
        what no phase claimed (``other``: reading the paths, the cache, the CLI) last."""
        names = [p for p in PHASES if p in self.wall_s] + sorted(set(self.wall_s) - set(PHASES))
        out = [(p, self.wall_s[p], self.peak_bytes.get(p)) for p in names]
        other = self.total_s - sum(self.wall_s.values())
        if other > 0:
            out.append(("other", other, self.peak_other_bytes))
        return out

    def to_dict(self) -> dict:
        mib = lambda b: None if b is None else round(b / 2**20, 1)  # noqa: E731
        return {
            "phases": [{"phase": p, "wall_s": round(s, 4), "peak_mib": mib(b)} for p, s, b in self.rows()],
            "total_s": round(self.total_s, 4),
            "peak_mib": mib(self.peak_total_bytes),
        }

    def text(self) -> str:
        lines = [f"{'phase':<10} {'wall s':>8} {'share':>6} {'peak MiB':>9}"]
        for p, s, b in self.rows():
            share = 100.0 * s / self.total_s if self.total_s > 0 else 0.0
            lines.append(f"{p:<10} {s:>8.3f} {share:>5.1f}% {'-' if b is None else f'{b / 2**20:,.0f}':>9}")
        peak = "-" if self.peak_total_bytes is None else f"{self.peak_total_bytes / 2**20:,.0f}"
        lines.append(f"{'total':<10} {self.total_s:>8.3f} {'':>6} {peak:>9}")
        return "\n".join(lines)


def _status_kib(key: bytes) -> int | None:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _rss() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class _Recorder:
    def __init__(self, into: Timings) -> None:
        self.into = into
        self.stack: list[str] = []
        self.thread = threading.get_ident()  # (the thread that marks phases)
        self.since = time.perf_counter()
        self.hwm = _status_kib(b"VmHWM:")
        self.seen = 0  # the largest sample since the last switch
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.sampler = threading.Thread(target=self._sample, name="proflab-timings", daemon=True) if self.hwm is not None else None

    def _sample(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            rss = _rss()
            if rss is not None:
                with self.lock:
                    self.seen = max(self.seen, rss)

    def switch(self) -> None:
        """Close the running stretch of the phase on top (or of none), charging it its time
        and peak."""
        now = time.perf_counter()
        hwm = _status_kib(b"VmHWM:") if self.hwm is not None else None
        with self.lock:
            rss = _rss() if hwm is not None else None
            seen = max(self.seen, rss or 0)
            self.seen = 0
        t = self.into
        peak = None
        if hwm is not None:
            peak = hwm if hwm > self.hwm else seen  # (a new process peak was reached in this stretch)
            t.peak_total_bytes = max(t.peak_total_bytes or 0, peak)
            self.hwm = hwm
        if self.stack:
            name = self.stack[-1]
            t.wall_s[name] = t.wall_s.get(name, 0.0) + (now - self.since)
            t.peak_bytes[name] = None if peak is None else max(t.peak_bytes.get(name) or 0, peak)
        elif peak is not None:
            t.peak_other_bytes = max(t.peak_other_bytes or 0, peak)
        self.since = now


_active: _Recorder | None = None


@contextmanager
def recording() -> Iterator[Timings]:
    """Record the phases marked until it closes; the :class:`Timings` is filled as it closes.
    Not reentrant: one recording a process (the CLI's)."""
    global _active
    out = Timings()
    start = time.perf_counter()
    rec = _Recorder(out)
    if rec.sampler is not None:
        rec.sampler.start()
    _active = rec
    try:
        yield out
    finally:
        rec.switch()
        _active = None
        rec.stop.set()
        if rec.sampler is not None:
            rec.sampler.join()
        out.total_s = time.perf_counter() - start


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark the code inside as phase ``name`` (one of ``PHASES``) while a recording is open;
    the same phase entered again inside itself counts once. Only the thread that opened the
    recording marks (a phase's helper threads are inside its time already)."""
    rec = _active
    if rec is None or (rec.stack and rec.stack[-1] == name) or threading.get_ident() != rec.thread:
        yield
        return
    rec.switch()
    rec.stack.append(name)
    try:
        yield
    finally:
        rec.switch()
        rec.stack.pop()
