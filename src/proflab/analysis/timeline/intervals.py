"""Interval arithmetic on integer-nanosecond spans, vectorised with numpy.

An :class:`IntervalSet` is a sorted list of disjoint half-open spans ``[start, end)``. It
answers "how much of ``[a, b)`` is covered" for many windows at once through a prefix sum,
which is what busy time per step, per gap and per range all reduce to.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["IntervalSet"]


@dataclass(frozen=True, eq=False)
class IntervalSet:
    """Disjoint, sorted spans. ``starts``/``ends`` are int64 ns arrays of equal length."""

    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def from_spans(cls, starts, ends) -> IntervalSet:
        """The union of possibly overlapping spans (touching spans merge; empty ones vanish)."""
        s = np.asarray(starts, dtype=np.int64)
        e = np.asarray(ends, dtype=np.int64)
        keep = e > s
        if not keep.all():
            s, e = s[keep], e[keep]
        del keep
        if s.size == 0:
            return cls.empty()
        # (millions of host events: no sort when already in order, and no array kept longer
        # than needed; ``reach`` is built in place when ``e`` is already a private copy)
        copied = False
        if not bool((s[1:] >= s[:-1]).all()):
            order = np.argsort(s, kind="stable")
            s, e = s[order], e[order]
            del order
            copied = True
        reach = np.maximum.accumulate(e, out=e) if copied else np.maximum.accumulate(e)
        new = np.empty(s.size, dtype=bool)
        new[0] = True
        new[1:] = s[1:] > reach[:-1]
        first = np.flatnonzero(new)
        last = np.append(first[1:] - 1, s.size - 1)
        return cls(s[first], reach[last])

    @classmethod
    def empty(cls) -> IntervalSet:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z)

    def __len__(self) -> int:
        return int(self.starts.size)

    @property
    def total_ns(self) -> int:
        return int((self.ends - self.starts).sum())

    def union(self, other: IntervalSet) -> IntervalSet:
        return IntervalSet.from_spans(
            np.concatenate([self.starts, other.starts]), np.concatenate([self.ends, other.ends])
        )

    def covered_before(self, t) -> np.ndarray:
        """Covered time in ``(-inf, t)`` for each t (vectorised): the time covered before the
        last span starting at or before t, and what of that span lies before t, looked up in
        the set's prefix (``_prefix``) with one search and no temporary beyond one gather (the
        514 MB trace's rules ask it of a million host events at once)."""
        t = np.asarray(t, dtype=np.int64)
        if self.starts.size == 0:
            return np.zeros(t.shape, dtype=np.int64)
        if t.ndim == 0:
            return self.covered_before(t.reshape(1)).reshape(())
        starts, ends, before = self._prefix()
        j = np.searchsorted(self.starts, t, side="right")  # (row j of the prefix: span j - 1, or none before the first)
        out = np.take(ends, j)
        np.minimum(out, t, out=out)
        out -= np.take(starts, j)
        out += np.take(before, j)
        return out

    def _prefix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The starts and ends with a span ``[min, min)`` put first (row 0: no span at or before
        an instant, which then covers ``min(t, min) - min = 0``), and the time covered before each
        row's span: built once a set, however often it is asked."""
        got = self.__dict__.get("_prefixed")
        if got is None:
            lowest = np.full(1, np.iinfo(np.int64).min, dtype=np.int64)
            before = np.zeros(self.starts.size + 1, dtype=np.int64)
            np.cumsum((self.ends - self.starts)[:-1], out=before[2:])
            got = (np.concatenate([lowest, self.starts]), np.concatenate([lowest, self.ends]), before)
            object.__setattr__(self, "_prefixed", got)
        return got

    def contains(self, t) -> np.ndarray:
        """Whether each instant ``t`` (ns) lies in a span: ``covered_within(t, t + 1) > 0``, in
        one search and without its temporaries (the 514 MB trace's 1.2 M host events in the
        observer's quiet spans: 49 -> 13 ms, 56 -> 28 MiB above what it held)."""
        t = np.asarray(t, dtype=np.int64)
        if self.starts.size == 0:
            return np.zeros(t.shape, dtype=bool)
        i = np.searchsorted(self.starts, t, side="right") - 1
        inside = self.ends[np.maximum(i, 0)] > t
        inside &= i >= 0
        return inside

    def covered_within(self, a, b) -> np.ndarray:
        """Covered time in each window ``[a, b)`` (arrays of equal shape, ns)."""
        a = np.asarray(a, dtype=np.int64)
        out = self.covered_before(np.maximum(np.asarray(b, dtype=np.int64), a))
        out -= self.covered_before(a)
        return out

    def clip(self, lo: int, hi: int) -> IntervalSet:
        return IntervalSet.from_spans(np.clip(self.starts, lo, hi), np.clip(self.ends, lo, hi))

    def gaps(self, lo: int | None = None, hi: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Uncovered spans between the first and last covered instant, or within [lo, hi)."""
        if self.starts.size == 0:
            if lo is None or hi is None or hi <= lo:
                return np.zeros(0, np.int64), np.zeros(0, np.int64)
            return np.array([lo], np.int64), np.array([hi], np.int64)
        gs, ge = self.ends[:-1], self.starts[1:]
        if lo is not None and lo < self.starts[0]:
            gs, ge = np.append([lo], gs), np.append([self.starts[0]], ge)
        if hi is not None and hi > self.ends[-1]:
            gs, ge = np.append(gs, [self.ends[-1]]), np.append(ge, [hi])
        if lo is not None or hi is not None:
            lo_ = lo if lo is not None else np.iinfo(np.int64).min
            hi_ = hi if hi is not None else np.iinfo(np.int64).max
            gs, ge = np.clip(gs, lo_, hi_), np.clip(ge, lo_, hi_)
            keep = ge > gs
            gs, ge = gs[keep], ge[keep]
        return gs, ge
