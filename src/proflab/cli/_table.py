"""Rows as a plain table in a given width (``proflab sql``, ``proflab runs``): the leading columns
that fit, floats lined up, and a note saying what was left out."""

from __future__ import annotations


_MAX_CELL = 48  # widest column in table output; longer values end in an ellipsis
_GUTTER = 3


def flat(df):
    """Nested columns (lists, structs) as JSON text: for CSV and the terminal."""
    import polars as pl

    nested = [c for c, t in df.schema.items() if t.is_nested()]
    return df.with_columns(
        pl.when(pl.col(c).is_not_null())
        .then(pl.struct(pl.col(c).alias("v")).struct.json_encode().str.slice(5).str.strip_suffix("}"))
        .alias(c)
        for c in nested
    )


def column_cells(values: list, *, is_float: bool) -> list[str]:
    """One column's values as text; floats share one format so that the points line up."""
    import math

    from proflab.render._text import printable

    finite = [v for v in values if isinstance(v, float) and math.isfinite(v)]
    fmt = "{:.3f}"
    if is_float and finite:
        if all(v == int(v) for v in finite) and max(abs(v) for v in finite) < 1e15:
            fmt = "{:.0f}"
        elif max(abs(v) for v in finite) >= 1e15 or max(abs(v) for v in finite) < 1e-3:
            fmt = "{:.4g}"

    def cell(v) -> str:
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return fmt.format(v) if math.isfinite(v) else str(v)
        # no line breaks inside a row, and a name's escape sequences shown, not obeyed
        return printable(" ".join(str(v).split()))

    return [cell(v) for v in values]


def frame_text(df, *, width: int, limit: int | None) -> str:
    """A result as a plain table in ``width`` columns: the leading columns that fit, at most
    ``limit`` rows, and a note saying what was left out and how to get it."""
    if df.width == 0:
        return "(the statement returned no result)\n"
    shown = flat(df.head(limit) if limit else df)
    return table_text(shown.columns, [t.is_numeric() for t in shown.dtypes],
                      {c: column_cells(shown[c].to_list(), is_float=t.is_float()) for c, t in shown.schema.items()},
                      shown.height, df.height, width)


def table_text(columns: list[str], numeric: list[bool], cells: dict[str, list[str]], height: int, total: int, width: int) -> str:
    """The table of ``frame_text`` from its columns' text (``column_cells``): ``height`` rows shown
    of ``total``. Needs no polars (``proflab sql`` from the cache uses it directly)."""
    import io
    import textwrap

    from rich import box
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from proflab.render._text import printable

    right = dict(zip(columns, numeric))
    console = Console(width=width, file=io.StringIO(), color_system=None, highlight=False)

    def table(cols: list[str]) -> Table:
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="")
        for c in cols:
            t.add_column(Text(printable(c)), justify="right" if right[c] else "left", no_wrap=True, overflow="ellipsis", max_width=_MAX_CELL)
        for i in range(height):
            t.add_row(*(Text(cells[c][i]) for c in cols))
        return t

    # The leading columns that fit at their natural width (3 cells between columns).
    cols: list[str] = []
    used = -_GUTTER
    for c in columns:
        natural = min(max(cell_len(x) for x in [printable(c), *cells[c]]), _MAX_CELL)
        if cols and used + _GUTTER + natural > width:
            break
        cols.append(c)
        used += _GUTTER + natural
    console.print(table(cols))
    notes = [f"{total} row{'s' if total != 1 else ''}" if height == total else
             f"{height} of {total} rows shown (--limit N; 0 for all; -f csv, json or parquet writes all)"]
    hidden = columns[len(cols):]
    if hidden:
        notes.append(f"{len(hidden)} more column{'s' if len(hidden) != 1 else ''} not shown: {', '.join(hidden)}")
    text = "".join(line.rstrip() + "\n" for line in console.file.getvalue().splitlines())
    for note in notes:
        text += "\n".join(textwrap.wrap(note, width=width, subsequent_indent="  ", break_on_hyphens=False)) + "\n"
    return text
