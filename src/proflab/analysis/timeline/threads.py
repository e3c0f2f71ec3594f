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
_ORDER_STEP = 1 << 18  # rows placed at a time by thread_order (its temporaries: ~12 MiB)
_BAND_COPIES = 64  # threads in a chunk up to which thread_order copies each one's rows as a run
_FEW_THREADS = 8  # threads up to which an event's rank is found by comparing it with each


class ThreadClock:
    def __init__(self, tids: list[pl.Series], times: list[pl.Series]) -> None:
        known = pl.concat([t.cast(pl.Int64).unique() for t in tids]).drop_nulls().unique().sort()
        self._known = known.to_numpy()  # threads, not events, in rank order
        self._rank = {int(t): i for i, t in enumerate(self._known.tolist())}
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
        """Each event's thread as its rank among the clock's threads (null: the band after
        theirs): 16-bit where they fit, which numpy's stable sort orders by radix (a stable
        sort of a trace's rows by thread keeps their start order within each thread). Raises
        for a thread the clock does not know."""
        rank, known = self._ranked(tid, self._unknown)
        if not known.all():
            raise ValueError(f"a thread the clock does not know: {tid.filter(pl.Series(~known) & tid.is_not_null())[0]}")
        return rank

    def rank_any(self, tid: pl.Series) -> np.ndarray:
        """:meth:`rank` of threads the clock may not know: those, and nulls, rank -1 (a band
        no key of a known thread is in)."""
        return self._ranked(tid, -1)[0]

    def _ranked(self, tid: pl.Series, null: int) -> tuple[np.ndarray, np.ndarray]:
        """Each event's rank (``null`` where its thread is null or unknown) and whether its
        thread is null or known: a comparison with each thread where they are few (a trace's
        1.2 M host rows on two threads: 2 ms where a polars replace of a dictionary took 4-8),
        else a search of them."""
        t = tid.cast(pl.Int64)
        nulls = t.is_null().to_numpy() if t.null_count() else None
        v = t.fill_null(0).to_numpy() if nulls is not None else t.to_numpy()
        dtype = np.int16 if len(self._rank) < 2**15 - 1 else np.int32
        if self._known.size <= _FEW_THREADS:
            rank = np.full(v.size, null, dtype=dtype)
            for i, thread in enumerate(self._known.tolist()):
                rank[v == thread] = i
            known = rank != null if null < 0 else rank < self._unknown
        else:
            at = np.minimum(np.searchsorted(self._known, v), max(self._known.size - 1, 0))
            known = self._known[at] == v if self._known.size else np.zeros(v.size, dtype=bool)
            rank = np.where(known, at, null).astype(dtype)
        if nulls is not None:
            rank[nulls] = null
            known |= nulls
        return rank, known

    def thread_order(self, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The positions of ``rank`` (from :meth:`rank`) grouped by thread, in the clock's
        thread order and stably (rows in start order stay in start order within their
        thread), and the number of rows of each thread band. A counting sort placed a chunk
        at a time: the order costs 4 bytes a row and the rest a chunk's temporaries, where
        numpy's argsort of every row cost 8 bytes a row and its radix buffers as much again."""
        bands = len(self._rank) + 1
        steps = range(0, rank.size, _ORDER_STEP)
        # (counted a chunk at a time: bincount widens its input to 8 bytes a row)
        per_band = sum((np.bincount(rank[i : i + _ORDER_STEP], minlength=bands) for i in steps), np.zeros(bands, dtype=np.int64))
        free = np.cumsum(per_band) - per_band  # the next free place of each band in the order
        order = np.empty(rank.size, dtype=np.uint32 if rank.size < 2**32 else np.int64)
        for i in steps:
            r = rank[i : i + _ORDER_STEP]
            o = np.argsort(r, kind="stable")  # (a radix sort of small integers)
            n = np.bincount(r, minlength=bands)
            present = np.flatnonzero(n)
            if present.size <= _BAND_COPIES:
                # each band's rows of the chunk are one run of ``o``: copied to their place as
                # a run (an export's 11.5 M host rows on two threads: the whole order 322 -> 85-93 ms)
                at = 0
                for b in present.tolist():
                    k = int(n[b])
                    order[free[b] : free[b] + k] = o[at : at + k] + i
                    at += k
            else:  # many threads in the chunk: every row scattered to its place at once
                grouped = r[o]
                first = np.cumsum(n) - n
                order[free[grouped] + (np.arange(o.size) - first[grouped])] = o + i
            free += n
        return order, per_band

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
