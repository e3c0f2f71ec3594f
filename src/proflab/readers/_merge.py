"""Merging a reader's per-table (or per-slice) frames into one time-ordered table, with
bounded extra memory: shared by the Kineto and Nsight Systems readers."""

from __future__ import annotations

import numpy as np
import polars as pl

__all__ = ["merge_by_start", "gather_text"]


def merge_by_start(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Concatenate a reader's frames of one schema in ``start_ns`` order (stable: ties keep table
    order). Built a few columns at a time (``_GATHER_BYTES``, at least ``_AT_LEAST``), each
    let go of once gathered, so the peak is the parts plus a few columns, never two copies of
    everything. A column no row fills (an export has no Python frames or autograd sequence
    numbers) becomes one null broadcast to the frame's length, which costs no memory per row;
    so does an integer column every row holds alike (a process's pid).

    The parts are held as their columns (series), never through a frame's ``select`` or
    ``drop``: those copied every column of a part built in several chunks (a Kineto slice's
    tables are), so each column merged copied all the columns left (the 514 MB trace's host
    table of 1.2 M rows in 31 parts: 144 MiB a time; its merge 316-349 -> 240-251 ms, and
    what it adds at most to the parts, the merged table included, 207-213 -> 160 MiB).

    The list is emptied: a caller that keeps no other reference to the frames has each
    column freed as soon as it is merged."""
    schema = parts[0].schema
    given, parts = parts, [p for p in parts if p.height]
    given.clear()
    if not parts:
        return pl.DataFrame(schema=schema)
    pieces = {c: [p.get_column(c) for p in parts] for c in schema}
    del parts
    empty = [c for c in schema if c != "start_ns" and all(s.null_count() == s.len() for s in pieces[c])]
    for c in empty:
        del pieces[c]
    same = {c: v for c in pieces if c != "start_ns" and schema[c].is_integer() and (v := _one_value(pieces[c])) is not None}
    for c in same:
        del pieces[c]
    names = list(pieces)
    if len(pieces["start_ns"]) == 1 and pieces["start_ns"][0].is_sorted():
        merged = pl.DataFrame([pieces[n][0].rechunk() for n in names])
    else:
        order = _start_order(pieces["start_ns"])
        columns = {}
        for name in [n for n in names if schema[n] == pl.String]:
            columns[name] = gather_text(pieces.pop(name), order)
        other = list(pieces)
        rows = order.len()
        size = max(_AT_LEAST, _GATHER_BYTES // (8 * rows))
        for group in (other[i : i + size] for i in range(0, len(other), size)):
            # a few columns at once, which polars gathers in parallel, from the parts' own
            # chunks (no concatenated copy of the group beside what is gathered)
            together = pl.DataFrame([pl.concat(pieces.pop(n), rechunk=False) for n in group])
            columns.update(together.select(pl.all().gather(order)).to_dict())
            del together
        merged = pl.DataFrame([columns[n] for n in names])
    return merged.with_columns(
        *(pl.lit(None, dtype=schema[c]).alias(c) for c in empty), *(pl.lit(v, dtype=schema[c]).alias(c) for c, v in same.items())
    ).select(list(schema))


def _one_value(pieces: list[pl.Series]):
    """The value every row of ``pieces`` holds, where there is one (no nulls); else None."""
    value = pieces[0].min()
    if any(s.null_count() or s.min() != value or s.max() != value for s in pieces):
        return None
    return value


# columns gathered together, up to this many bytes of 8-byte values: polars gathers a group's
# columns in parallel (a 1.2 M row table: six at once), while a table of millions of rows goes
# two columns at a time, one a core (four at once raised a 506 MB export's read peak from 768
# to 878 MiB; one at a time left a core idle through the 1048 MB export's 11.5 M row host
# merge: two, its whole analysis 8.21 -> 7.87 s, peak 1,439 -> 1,434 MiB; within the default
# budget 8.78 -> 8.67 s, 1,250 -> 1,259 MiB)
_GATHER_BYTES = 64 << 20
_AT_LEAST = 2


def _start_order(columns: list[pl.Series]) -> pl.Series:
    """Row order of the concatenated parts by start (stable; a row without a start first, as
    polars sorts nulls: an Nsight Systems export's damaged rows are dropped after the merge).
    numpy's stable sort is a timsort, which takes the ordered runs readers produce as they are
    (an export's tables each in start order; the 514 MB Kineto trace's 1.2 M host rows in
    230 k runs): 4-12 ms for those rows where polars' sort took 40 ms. (Nulls are filled
    first: with them ``to_numpy`` gives floats, which round epoch timestamps in ns.)"""
    lowest = np.iinfo(np.int64).min
    starts = np.concatenate([s.fill_null(lowest).to_numpy() for s in columns])
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
