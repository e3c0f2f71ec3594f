"""A run directory's ``monitor.parquet`` (the GPU monitor's NVML samples), read or refused in one
line: a damaged file can make polars panic, and its PanicException derives from BaseException,
so ``except Exception`` lets it through as a traceback (a zeroed block did)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from proflab.errors import CorruptInput

__all__ = ["read_monitor"]


def read_monitor(path: str | Path, columns: list[str] | None = None) -> pl.DataFrame:
    """The samples (only ``columns`` when given); CorruptInput naming the file when unreadable."""
    try:
        return pl.read_parquet(path, columns=columns)
    except (Exception, pl.exceptions.PanicException) as e:  # truncated, zeroed, not parquet
        raise CorruptInput(path, f"not a readable parquet file ({type(e).__name__})") from None
