"""Python source lines from ``with_stack=True`` traces.

Kineto records Python frames as ``python_function`` events (``file.py(42): func``) with a
parent id. For a host instant on a thread we take the innermost frame that encloses it and
climb to the nearest frame of user code (not torch, not the standard library, not
site-packages) — vectorised: one as-of join, then a few array steps up the parent chain.
"""

from __future__ import annotations

import sys

import numpy as np
import polars as pl

from proflab.model import Trace

__all__ = ["user_frames"]

_STDLIB = "|".join(sorted(m for m in sys.stdlib_module_names if m.isidentifier()))
_NOT_USER = (
    r"site-packages|dist-packages|/lib/python\d|^<built-in|^<frozen|^<string>|^<lambda>|"
    rf"^(?:torch|torchvision|torchaudio|triton|numpy|lightning|pytorch_lightning|transformers)/|^(?:{_STDLIB})(?:/|\.py\()"
)
# A source frame reads "file.py(42): function"; "nn.Module: Linear_0" and the like are not.
_FRAME = r"^.+\.py\(\d+\): "
_MAX_DEPTH = 256


def user_frames(trace: Trace, points: pl.DataFrame) -> pl.Series:
    """For rows of ``points`` (columns ``tid``, ``t_ns``), the innermost user-code frame name
    (``file.py(line): function``) enclosing that instant, or null. Same length and order."""
    frames = trace.cpu.filter(pl.col("cat") == "python_function")
    if frames.height == 0 or points.height == 0:
        return pl.Series("frame", [None] * points.height, dtype=pl.String)
    frames = (
        frames.select(
            "tid",
            "start_ns",
            (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
            "python_id",
            "python_parent_id",
            "name",
            (pl.col("name").str.contains(_FRAME) & ~pl.col("name").str.contains(_NOT_USER)).alias("is_user"),
        )
        .sort("start_ns")
        .with_row_index("row")
    )
    parent = frames.join(
        frames.select(pl.col("python_id").alias("python_parent_id"), pl.col("row").alias("parent_row")),
        on="python_parent_id",
        how="left",
    ).sort("row")["parent_row"]
    parent_row = parent.fill_null(-1).cast(pl.Int64).to_numpy()
    starts = frames["start_ns"].to_numpy()
    ends = frames["end_ns"].to_numpy()
    is_user = frames["is_user"].to_numpy()

    cand = (
        points.select(pl.col("tid").cast(pl.Int64), pl.col("t_ns").cast(pl.Int64))
        .with_row_index("_i")
        .sort("t_ns")
        .join_asof(
            frames.select("tid", "start_ns", "row"), left_on="t_ns", right_on="start_ns", by="tid", check_sortedness=False
        )
        .sort("_i")
    )
    t = cand["t_ns"].to_numpy()
    idx = cand["row"].fill_null(-1).cast(pl.Int64).to_numpy()
    for _ in range(_MAX_DEPTH):
        ok = idx >= 0
        j = np.where(ok, idx, 0)
        done = ~ok | ((starts[j] <= t) & (ends[j] >= t) & is_user[j])
        if done.all():
            break
        idx = np.where(done, idx, parent_row[j])
    found = frames["name"].gather(np.where(idx >= 0, idx, 0))
    return (
        pl.DataFrame({"frame": found, "missing": idx < 0})
        .select(pl.when(pl.col("missing")).then(None).otherwise(pl.col("frame")).alias("frame"))
        .to_series()
    )
