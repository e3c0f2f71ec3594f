"""Sortable (thread, time) keys, so per-thread interval questions become one numpy search.

``ThreadClock.key(tid, t)`` maps each thread to its own band of int64 values (thread rank
times the time span, plus the offset in ns), so sorting or searching keys never mixes
threads: "the first launch on this thread at or after t" is one ``searchsorted``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from proflab.errors import ProflabError

__all__ = ["ThreadClock"]


_STEP = 1 << 20  # events whose thread offsets are computed at a time (8 MiB)


class ThreadClock:
    def __init__(self, tids: list[pl.Series], times: list[pl.Series]) -> None:
        known = pl.concat([t.cast(pl.Int64).unique() for t in tids]).drop_nulls().unique().sort()
        self._rank = {int(t): i for i, t in enumerate(known)}  # threads, not events
        # events of no known thread (a trace's tid without digits reads as null) get a band
        # of their own after the threads': they never meet any thread's events
        self._unknown = len(self._rank)
        # min and max per series: concatenating every timestamp would copy them all
        lows = [v for v in (t.min() for t in times) if v is not None]
        highs = [v for v in (t.max() for t in times) if v is not None]
        self.t0 = int(min(lows)) if lows else 0
        self.span = (int(max(highs)) if highs else 0) - self.t0 + 1
        if (len(self._rank) + 1) * self.span >= 2**63:
            # (a real trace spans hours: this is a clock or duration decades long)
            raise ProflabError(
                f"the trace's host events span {self.span / 3.6e12:,.0f} hours over {len(self._rank)} threads: "
                "a damaged timestamp or duration; proflab cannot place them on one timeline"
            )

    def rank(self, tid: pl.Series) -> np.ndarray:
        """Each event's thread as its rank among the clock's threads: 16-bit where they fit,
        which numpy's stable sort orders by radix (a stable sort of a trace's rows by thread
        keeps their start order within each thread)."""
        dtype = pl.Int16 if len(self._rank) < 2**15 - 1 else pl.Int32
        return tid.cast(pl.Int64).replace_strict(self._rank, return_dtype=dtype).fill_null(self._unknown).to_numpy()

    def key_ranked(self, rank: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Keys for times ``t`` (int64 ns) on threads given by :meth:`rank`. ``t`` is consumed:
        the keys are written over it where it is a writable int64 array."""
        key = t if t.dtype == np.int64 and t.flags.writeable else t.astype(np.int64)
        key -= self.t0  # in place: one array per call, however many events
        for i in range(0, key.size, _STEP):  # the ranks' offsets a slice at a time, not an array of them
            key[i : i + _STEP] += np.multiply(rank[i : i + _STEP], self.span, dtype=np.int64)
        return key

    def key(self, tid: pl.Series, t: pl.Series) -> np.ndarray:
        return self.key_ranked(self.rank(tid), t.cast(pl.Int64).to_numpy(writable=True))

    def unkey(self, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tid, t) back from keys made by :meth:`key`; the band of no known thread gives -1."""
        tids = np.array([*sorted(self._rank, key=self._rank.get), -1], dtype=np.int64)
        rank, off = np.divmod(np.asarray(key, dtype=np.int64), self.span)
        return tids[rank], off + self.t0
