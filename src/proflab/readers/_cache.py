"""The columnar cache: a trace's normalized tables, kept as Arrow IPC after the first read.

Reading a large JSON trace costs seconds; the tables it becomes are a fraction of its size
and load from Arrow IPC in a fraction of the time. The first read of a trace of at least
``PROFLAB_CACHE_MIN_MB`` (default 16) writes an entry; later reads of the same file load it.

* **Where**: ``$PROFLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/proflab``, else
  ``~/.cache/proflab``; one folder per entry (about a quarter of the trace's uncompressed
  size). The cache is trimmed to a size, least recently used first (``_cachedir``).
* **Key**: the trace's resolved path, size and modification time, and the reader's version
  (a hash of the reader and model sources, so any change to how traces are read makes new
  entries instead of reusing stale ones).
* **Safe**: an entry is written in a private temporary folder and renamed into place in one
  step, so a concurrent reader sees a whole entry or none, and two writers of the same entry
  leave one. An entry that fails to load (truncated, corrupt, wrong schema) is removed and
  the trace read again, never an error; a cache folder that cannot be written is skipped.
* ``--no-cache`` (``load(path, cache=False)``, or ``PROFLAB_NO_CACHE=1``) neither reads nor
  writes the cache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

import polars as pl

from proflab.model.trace import COMM_SCHEMA, CPU_SCHEMA, DEVICE_SCHEMA, GPU_SCHEMA, STEP_SCHEMA, Trace, TraceMeta
from proflab.readers._cachedir import cache_root, enabled, reader_version, touch, trace_key, trim

__all__ = ["enabled", "entry_dir", "load_entry", "store", "scan_entry", "drop"]

_TABLES = {"gpu": GPU_SCHEMA, "cpu": CPU_SCHEMA, "steps": STEP_SCHEMA, "devices": DEVICE_SCHEMA, "comms": COMM_SCHEMA}


def entry_dir(path: Path) -> Path | None:
    key = trace_key(path)
    return None if key is None else cache_root() / key


def _remove(d: Path) -> None:
    shutil.rmtree(d, ignore_errors=True)


def drop(path: Path) -> None:
    """Remove the entry for ``path`` (a damaged one found while reading it)."""
    d = entry_dir(path)
    if d is not None:
        _remove(d)


def _meta_ok(d: Path) -> TraceMeta | None:
    meta = json.loads((d / "meta.json").read_text())
    if meta.pop("_version", None) != reader_version():
        return None
    meta["notes"] = tuple(meta.get("notes") or ())
    meta.pop("next_part_work", None)  # (a part's only: whole traces are cached)
    return TraceMeta(**meta)


class Entry:
    """A cache entry's tables as lazy scans (nothing read until collected), with its meta.
    Text columns are stored as codes into a dictionary of their distinct values:
    :meth:`collect` turns them back into text that shares the dictionary's bytes (a kernel
    name of 200 bytes repeated a million times is kept once, not a million times)."""

    def __init__(self, d: Path, frames: dict[str, pl.LazyFrame], meta: TraceMeta) -> None:
        self.dir, self.frames, self.meta = d, frames, meta

    def collect(self, name: str, frame: pl.LazyFrame | None = None) -> pl.DataFrame:
        df = (self.frames[name] if frame is None else frame).collect()
        schema = _TABLES[name]
        text = [c for c, t in schema.items() if t == pl.String]
        df = df.with_columns(
            pl.read_ipc(self.dir / f"{name}.{c}.arrow").to_series().gather(df.get_column(c)).alias(c) for c in text
        )
        # a column no row fills becomes one broadcast null, as the readers leave it (every
        # filter of the table would otherwise copy it)
        empty = [c for c in df.columns if df.height and df.get_column(c).null_count() == df.height]
        return df.with_columns(pl.lit(None, dtype=schema[c]).alias(c) for c in empty)


def _stored_schema(schema: dict[str, pl.DataType]) -> dict[str, pl.DataType]:
    return {c: (pl.UInt32 if t == pl.String else t) for c, t in schema.items()}


def scan_entry(path: Path) -> Entry | None:
    """The entry for ``path``, or None when there is no usable one (a broken one is removed)."""
    d = entry_dir(path)
    if d is None or not d.is_dir():
        return None
    try:
        meta = _meta_ok(d)
        if meta is None:
            raise ValueError("stale entry")
        frames = {}
        for name, schema in _TABLES.items():
            lf = pl.scan_ipc(d / f"{name}.arrow")
            if dict(lf.collect_schema()) != _stored_schema(schema):
                raise ValueError(f"{name}: schema differs")
            frames[name] = lf
        touch(d)
        return Entry(d, frames, meta)
    except Exception:  # any damage: drop the entry and read the trace again
        _remove(d)
        return None


def load_entry(path: Path) -> Trace | None:
    """The cached trace, or None (a broken entry is removed)."""
    entry = scan_entry(path)
    if entry is None:
        return None
    try:
        return Trace(**{name: entry.collect(name) for name in _TABLES}, meta=entry.meta)
    except Exception:
        drop(path)
        return None


def _encoded(df: pl.DataFrame, schema: dict[str, pl.DataType], tmp: Path, name: str) -> pl.DataFrame:
    """``df`` with its text columns as UInt32 codes; each dictionary written beside it."""
    for c, t in schema.items():
        if t != pl.String:
            continue
        dictionary = df.get_column(c).unique(maintain_order=True)
        dictionary.to_frame(c).write_ipc(tmp / f"{name}.{c}.arrow")
        lookup = dictionary.to_frame(c).with_row_index("_code")
        codes = df.select(c).join(lookup, on=c, how="left", maintain_order="left", nulls_equal=True)["_code"]
        df = df.with_columns(codes.cast(pl.UInt32).alias(c))
    return df


def store(path: Path, trace: Trace) -> None:
    """Write the entry for ``path``; any failure leaves no entry and is not an error."""
    d = entry_dir(path)
    if d is None or d.exists():
        return
    tmp = None
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}.", dir=d.parent))
        for name, schema in _TABLES.items():
            _encoded(getattr(trace, name), schema, tmp, name).write_ipc(tmp / f"{name}.arrow")
        meta = dataclasses.asdict(trace.meta)
        meta["notes"] = list(meta["notes"])
        meta["_version"] = reader_version()
        (tmp / "meta.json").write_text(json.dumps(meta))
        os.rename(tmp, d)  # atomic; fails when another process put the entry first
        tmp = None
        trim()
    except Exception:
        pass
    finally:
        if tmp is not None:
            _remove(tmp)
