"""Python source lines from ``with_stack=True`` traces.

Kineto records Python frames as ``python_function`` events (``file.py(42): func``) with a
parent id. For a host instant on a thread we take the innermost frame that encloses it and
climb to the nearest frame of user code (not torch, not the standard library, not
site-packages) — vectorised: one search of the frames' (thread, start) keys, then a few array
steps up the parent chain.
"""

from __future__ import annotations

import sys

import numpy as np
import polars as pl

from proflab.analysis.timeline.threads import ThreadClock
from proflab.model import Trace

__all__ = ["FrameIndex"]

_STDLIB = "|".join(sorted(m for m in sys.stdlib_module_names if m.isidentifier()))
_NOT_USER = (
    r"site-packages|dist-packages|/lib/python\d|^<built-in|^<frozen|^<string>|^<lambda>|"
    rf"^(?:torch|torchvision|torchaudio|triton|numpy|lightning|pytorch_lightning|transformers)/|^(?:{_STDLIB})(?:/|\.py\()"
)
# A source frame reads "file.py(42): function"; "nn.Module: Linear_0" and the like are not.
_FRAME = r"^.+\.py\(\d+\): "
_MAX_DEPTH = 256


def _parent_rows(frames: pl.DataFrame) -> np.ndarray:
    """Each frame's parent's row (-1: none recorded, or not among the frames). Kineto numbers
    frames in the order it records them, so the ids are one rising run: a search of each
    parent id among them (the 514 MB trace's 578 k frames: 5 ms where a join took 57); else
    a join."""
    ids = frames.get_column("python_id")
    if ids.null_count() == 0 and ids.len() and bool((np.diff(v := ids.to_numpy()) > 0).all()):
        want = frames.get_column("python_parent_id").fill_null(v[0] - 1).to_numpy()
        i = np.minimum(np.searchsorted(v, want), v.size - 1)
        return np.where(v[i] == want, i, -1).astype(np.int64)
    parent = (
        frames.select("row", "python_parent_id")
        .join(frames.select(pl.col("python_id").alias("python_parent_id"), pl.col("row").alias("parent_row")),
              on="python_parent_id", how="left")
        .sort("row")["parent_row"]
    )  # fmt: skip
    return parent.fill_null(-1).cast(pl.Int64).to_numpy()


class FrameIndex:
    """The Python frames of a trace, indexed once for any number of :meth:`lookup` calls."""

    def __init__(self, trace: Trace) -> None:
        # (lazy: only these columns of the frames' rows are copied, never the whole host table's)
        self.frames = (
            trace.cpu.lazy()
            .with_row_index("cpu_row")
            .filter(pl.col("cat") == "python_function")
            .select(
                "tid",
                "start_ns",
                (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
                "python_id",
                "python_parent_id",
                "name",
                "cpu_row",
            )
            .collect()
        )
        if not self.frames.get_column("start_ns").is_sorted():  # (in start order as the host table is, or sorted)
            self.frames = self.frames.sort("start_ns")
        self.frames = self.frames.with_row_index("row")
        # the patterns once per distinct name (hundreds), not per frame (hundreds of thousands)
        names = self.frames.get_column("name").unique()
        user = names.filter(names.str.contains(_FRAME) & ~names.str.contains(_NOT_USER))
        self.frames = self.frames.with_columns(pl.col("name").is_in(user.implode()).alias("is_user"))
        self.parent_row = _parent_rows(self.frames)
        self.starts = self.frames["start_ns"].to_numpy()
        self.ends = self.frames["end_ns"].to_numpy()
        self.is_user = self.frames["is_user"].to_numpy()
        self._index_by_thread()
        # what lookups read of the frames beside these arrays (the ids served the parents): each
        # frame's row of the host table, whose names the trace keeps anyway (a copy of the 577 k
        # frames' names on the 514 MB trace: its timeline phase's peak 9 MiB higher)
        self._names = trace.cpu.get_column("name")
        self._cpu_rows = self.frames.get_column("cpu_row").to_numpy()
        del self.frames

    def _index_by_thread(self) -> None:
        """The frames' (thread, start) keys in order (``ThreadClock``), with each key's row and
        thread rank: the frame starting last at or before an instant on its thread is one
        search (``_innermost``), where an as-of join by thread cost 54 of the 514 MB trace's
        86 ms of lookups. Frames are in start order, so a stable grouping by thread (a
        counting sort) orders the keys."""
        self._clock = ThreadClock([self.frames.get_column("tid")], [self.frames.get_column("start_ns")])
        rank = self._clock.rank(self.frames.get_column("tid"))  # (a frame of no thread: the band after theirs)
        order, _ = self._clock.thread_order(rank)
        self._rows = order.astype(np.int64)
        self._key_rank = rank[order]
        self._keys = self._clock.key_ranked(self._key_rank, self.starts[order])

    def __len__(self) -> int:
        return len(self._cpu_rows)

    @property
    def names(self) -> pl.Series:
        """Each frame's name (``file.py(line): function``), in the index's row order."""
        return self._names.gather(self._cpu_rows)

    def lookup(self, points: pl.DataFrame) -> pl.Series:
        """For rows of ``points`` (columns ``tid``, ``t_ns``), the innermost user-code frame
        name (``file.py(line): function``) enclosing that instant, or null. Same order."""
        if not self or points.height == 0:
            return pl.Series("frame", [None] * points.height, dtype=pl.String)
        t, idx = self._innermost(points.get_column("tid"), points.get_column("t_ns"))
        for _ in range(_MAX_DEPTH):  # steps up the frame stack, all points at once
            ok = idx >= 0
            j = np.where(ok, idx, 0)
            done = ~ok | ((self.starts[j] <= t) & (self.ends[j] >= t) & self.is_user[j])
            if done.all():
                break
            idx = np.where(done, idx, self.parent_row[j])
        found = self._names.gather(self._cpu_rows[np.where(idx >= 0, idx, 0)])
        return (
            pl.DataFrame({"frame": found, "missing": idx < 0})
            .select(pl.when(pl.col("missing")).then(None).otherwise(pl.col("frame")).alias("frame"))
            .to_series()
        )

    def _innermost(self, tid: pl.Series, t_ns: pl.Series) -> tuple[np.ndarray, np.ndarray]:
        """Each instant (its time in ns, 0 where null) and the row of the frame that starts last
        at or before it on its thread (the last of frames starting together), -1 where none
        does: a null time or thread, a thread without frames, an instant before every frame.
        An instant past the frames' clock is searched at its end (the thread's last frame)."""
        t = t_ns.cast(pl.Int64).fill_null(0).to_numpy()
        rank = self._clock.rank_any(tid)
        known = t_ns.is_not_null().to_numpy() & (t >= self._clock.t0) & (rank >= 0)
        keys = self._clock.key_ranked(rank, np.clip(t, self._clock.t0, self._clock.t0 + self._clock.span - 1))
        at = np.searchsorted(self._keys, keys, side="right") - 1
        known &= at >= 0
        at = np.maximum(at, 0)
        known &= self._key_rank[at] == rank
        return t, np.where(known, self._rows[at], -1)

    def top_lines(self, points: pl.DataFrame, top: int = 5) -> list[str]:
        """The most frequent user lines at these instants (rows with nulls are skipped)."""
        frames = self.lookup(points.drop_nulls()).drop_nulls()
        return frames.value_counts(sort=True).head(top)["frame"].to_list() if frames.len() else []
