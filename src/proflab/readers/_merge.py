"""Merging a reader's per-table (or per-slice) frames into one time-ordered table, with
bounded extra memory: shared by the Kineto and Nsight Systems readers."""

from __future__ import annotations

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
        starts = pl.concat([p.get_column("start_ns") for p in parts]).to_frame().with_row_index()
        order = starts.sort("start_ns", maintain_order=True).get_column("index")
        del starts
        columns = []
        for name in parts[0].columns:
            pieces = [p.get_column(name) for p in parts]
            if pieces[0].dtype == pl.String:
                columns.append(gather_text(pieces, order))
            else:
                columns.append(pl.concat(pieces).gather(order))
            parts = [p.drop(name) for p in parts]
        merged = pl.DataFrame(columns)
    return merged.with_columns(pl.lit(None, dtype=schema[c]).alias(c) for c in empty).select(list(schema))


def gather_text(pieces: list[pl.Series], order: pl.Series) -> pl.Series:
    """``concat(pieces).gather(order)`` for text, through a dictionary of the distinct
    values: concatenating string columns copies every row's bytes (a kernel name is ~175
    bytes, repeated millions of times), while gathering from one dictionary only writes a
    16-byte view per row that points into it."""
    name = pieces[0].name
    dictionary = pl.concat([p.drop_nulls().unique() for p in pieces]).unique(maintain_order=True).rename("_text")
    lookup = dictionary.to_frame().with_row_index("_code")
    codes = pl.concat(
        [p.rename("_text").to_frame().join(lookup, on="_text", how="left", maintain_order="left")["_code"] for p in pieces]
    )
    return dictionary.gather(codes.gather(order)).rename(name)
