"""Merging a reader's per-table (or per-slice) frames into one time-ordered table, with
bounded extra memory: shared by the Kineto and Nsight Systems readers."""

from __future__ import annotations

import numpy as np
import polars as pl

__all__ = ["merge_by_start", "gather_text"]


def merge_by_start(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Concatenate a reader's frames of one schema in ``start_ns`` order (stable: ties keep table
    order). Built one column at a time, each dropped from the parts once gathered, so the
    peak is the parts plus about one column, never two copies of everything. A column no
    row fills (an export has no Python frames or autograd sequence numbers) becomes one
    null broadcast to the frame's length, which costs no memory per row.

    The list is emptied: a caller that keeps no other reference to the frames has each
    column freed as soon as it is merged."""
    schema = parts[0].schema
    given, parts = parts, [p for p in parts if p.height]
    given.clear()
    if not parts:
        return pl.DataFrame(schema=schema)
    empty = [c for c in schema if c != "start_ns" and all(p.get_column(c).null_count() == p.height for p in parts)]
    parts = [p.drop(empty) for p in parts]
    if len(parts) == 1 and parts[0]["start_ns"].is_sorted():
        merged = parts[0].rechunk()
    else:
        order = _start_order(parts)
        columns = {}
        names = parts[0].columns
        text = [n for n in names if parts[0].schema[n] == pl.String]
        for name in text:
            columns[name] = gather_text([p.get_column(name) for p in parts], order)
            parts = [p.drop(name) for p in parts]
        other = [n for n in names if n not in columns]
        rows = sum(p.height for p in parts)
        size = max(1, _GATHER_BYTES // (8 * rows))
        for group in (other[i : i + size] for i in range(0, len(other), size)):
            # a few columns at once, which polars gathers in parallel, from the parts' own
            # chunks (no concatenated copy of the group beside what is gathered)
            gathered = pl.concat([p.select(group) for p in parts], rechunk=False).select(pl.all().gather(order))
            columns.update(gathered.to_dict())
            parts = [p.drop(group) for p in parts]
        merged = pl.DataFrame([columns[n] for n in names])
    return merged.with_columns(pl.lit(None, dtype=schema[c]).alias(c) for c in empty).select(list(schema))


# columns gathered together, up to this many bytes of 8-byte values: polars gathers a group's
# columns in parallel (a 1.2 M row table: six at once), while a table of millions of rows goes
# a column at a time (four at once raised a 506 MB export's read peak from 768 to 878 MiB)
_GATHER_BYTES = 64 << 20


def _start_order(parts: list[pl.DataFrame]) -> pl.Series:
    """Row order of the concatenated parts by start (stable; a row without a start first, as
    polars sorts nulls: an Nsight Systems export's damaged rows are dropped after the merge).
    numpy's stable sort is a timsort, linear on the nearly ordered starts readers produce (a
    Kineto slice is out of order at a few dozen places): 4 ms for 1.2 M rows where polars' sort
    took 40 ms. (Nulls are filled first: with them ``to_numpy`` gives floats, which round
    epoch timestamps in ns.)"""
    lowest = np.iinfo(np.int64).min
    starts = np.concatenate([p.get_column("start_ns").fill_null(lowest).to_numpy() for p in parts])
    return pl.Series("order", np.argsort(starts, kind="stable"))


def gather_text(pieces: list[pl.Series], order: pl.Series) -> pl.Series:
    """``concat(pieces).gather(order)`` for text, through a dictionary of the distinct
    values: the gathered column's rows point into the small dictionary, not into each
    piece's own copy of its rows' bytes (a kernel name is ~175 bytes, repeated millions of
    times), so the pieces' text is freed once merged. One join of all rows against the
    dictionary (one per piece cost 1.5x as much). A column mostly null (the input shapes
    that a few operators carry) is gathered as it is: its few values' bytes are little to
    keep, and the dictionary's join of every row cost twice the gather (the 514 MB Kineto
    trace's two shape columns, 98 % null: 0.078 -> 0.043 s)."""
    name = pieces[0].name
    text = pl.concat(pieces).rename("_text")
    if text.null_count() * 2 > text.len():
        return text.gather(order).rename(name)
    dictionary = text.drop_nulls().unique(maintain_order=True)
    codes = text.to_frame().join(dictionary.to_frame().with_row_index("_code"), on="_text", how="left", maintain_order="left")
    del text
    return dictionary.gather(codes.get_column("_code").gather(order)).rename(name)
