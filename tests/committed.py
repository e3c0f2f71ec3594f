"""The committed traces by name: the large ones are xz-compressed (about half gzip's bytes, for
the repository's size), the others gzip, so a test that builds a trace's name from its stem
asks here which it is."""

from __future__ import annotations

from pathlib import Path


def committed(folder: Path, stem: str) -> Path:
    """``folder/<stem>.pt.trace.json.xz`` where that is committed, else ``.pt.trace.json.gz``."""
    xz = folder / f"{stem}.pt.trace.json.xz"
    return xz if xz.is_file() else folder / f"{stem}.pt.trace.json.gz"
