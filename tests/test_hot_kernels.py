"""hot_kernels' launch dims: per kernel name the most frequent grid and block, the first in
text order on a tie, launches with an unknown dimension left out."""

from __future__ import annotations

from collections import Counter

import polars as pl

import proflab
from proflab.analysis.context import Context
from proflab.analysis.timeline.kernels import hot_kernels


def _reference(rows: pl.DataFrame, dims: str) -> dict[str, str | None]:
    counts: dict[str, Counter] = {}
    for name, x, y, z in rows.select("name", f"{dims}_x", f"{dims}_y", f"{dims}_z").iter_rows():
        c = counts.setdefault(name, Counter())
        if None not in (x, y, z):
            c[f"{x}x{y}x{z}"] += 1
    out = {}
    for name, c in counts.items():
        top = max(c.values(), default=0)
        out[name] = min((t for t, n in c.items() if n == top), default=None)
    return out


def test_dims_are_the_most_frequent_first_in_text_order_on_a_tie(find_trace):
    trace = proflab.load(find_trace("train_loop"))
    ctx = Context(trace)
    rows = ctx.kernel_rows
    # one name's launches made a tie of 2x1x1 and 10x1x1 ("10x1x1" sorts first as text), and
    # another's launches given an unknown grid_y (left out of its mode)
    name = rows["name"].value_counts(sort=True)["name"][0]
    other = rows["name"].value_counts(sort=True)["name"][1]
    i = pl.int_range(pl.len())
    rows = rows.with_columns(
        pl.when(pl.col("name") == name).then(pl.when(i % 2 == 0).then(2).otherwise(10)).otherwise(pl.col("grid_x")).cast(pl.Int32).alias("grid_x"),
        pl.when(pl.col("name") == name).then(1).otherwise(pl.col("grid_y")).cast(pl.Int32).alias("grid_y"),
        pl.when(pl.col("name") == name).then(1).otherwise(pl.col("grid_z")).cast(pl.Int32).alias("grid_z"),
        pl.when((pl.col("name") == other) & (i % 3 == 0)).then(None).otherwise(pl.col("block_y")).cast(pl.Int32).alias("block_y"),
    )
    if rows.filter(pl.col("name") == name).height % 2:  # an even count: an exact tie
        rows = rows.filter(~((pl.col("name") == name) & (i == i.filter(pl.col("name") == name).last())))
    table = hot_kernels(trace, rows, ctx.frames)
    got = {dims: dict(table.select("name", dims).iter_rows()) for dims in ("grid", "block")}
    assert got["grid"][name] == "10x1x1"
    assert got == {dims: _reference(rows, dims) for dims in ("grid", "block")}
