"""Where the cache lives, how its entries are named, and how it is kept to a size.

No polars here: the report cache (``proflab.report.cache``) answers a repeated ``analyze``
from this module alone, without importing the table stack.

* **Root**: ``$PROFLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/proflab``, else ``~/.cache/proflab``.
  Table entries are folders named by their key (``_cache``); reports are
  ``reports/<key>.json`` (``proflab.report.cache``).
* **Size**: after each write the cache is trimmed to ``$PROFLAB_CACHE_MAX_MB`` (default
  4096), least recently used first (an entry's modification time is refreshed each time it
  is used). ``proflab cache --list`` shows the entries, ``proflab cache --clear`` removes them.
* **Concurrent runs**: entries are written under a temporary name and renamed into place;
  a reader that loses an entry to another process's trimming reads the trace again.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["cache_root", "enabled", "reader_version", "analysis_version", "trace_key", "touch", "trim", "entries", "clear"]

FORMAT = 2  # layout of a table entry
_STALE_TMP_S = 3600  # a temporary entry older than this was left by a killed process


def cache_root() -> Path:
    env = os.environ.get("PROFLAB_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "proflab"


def enabled(path: Path, cache: bool | None) -> bool:
    """Whether this read uses the cache: not when turned off, and only for large files."""
    if cache is False or os.environ.get("PROFLAB_NO_CACHE", "").strip() not in ("", "0"):
        return False
    try:
        min_bytes = float(os.environ.get("PROFLAB_CACHE_MIN_MB", "16")) * 1e6
        return path.stat().st_size >= min_bytes
    except (OSError, ValueError):
        return False


def _hash_sources(h, files) -> str:
    for f in sorted(files):
        try:
            h.update(f.name.encode() + f.read_bytes())
        except OSError:
            pass
    return h.hexdigest()[:16]


@lru_cache(maxsize=1)
def reader_version() -> str:
    """proflab's version and a hash of the sources that decide the tables."""
    from proflab._version import __version__

    here = Path(__file__).resolve().parent
    h = hashlib.sha256(f"{__version__}/{FORMAT}".encode())
    return _hash_sources(h, [*here.glob("*.py"), here.parent / "model" / "trace.py"])


@lru_cache(maxsize=1)
def analysis_version() -> str:
    """A hash of every source of the package: any change to what a report holds makes new
    report entries instead of reusing stale ones."""
    from proflab._version import __version__

    pkg = Path(__file__).resolve().parent.parent
    h = hashlib.sha256(f"{__version__}/report".encode())
    return _hash_sources(h, [f for f in pkg.rglob("*.py") if "__pycache__" not in f.parts])


def trace_key(path: Path) -> str | None:
    """The key of a trace file's tables: resolved path, size, modification time, reader."""
    try:
        p = path.resolve()
        st = p.stat()
    except OSError:
        return None
    return hashlib.sha256(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0{reader_version()}".encode()).hexdigest()[:32]


def touch(p: Path) -> None:
    """Mark an entry as used now (least recently used entries are trimmed first)."""
    try:
        os.utime(p)
    except OSError:
        pass


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    kind: str  # "tables" | "report" | "partial" (a write in progress, or left by a killed one)
    bytes: int
    used: float  # last use, seconds since the epoch


def _size(p: Path) -> int:
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


# what proflab writes, and nothing else: a cache folder pointed at a folder of the user's
# never loses a file that is not an entry
_ENTRY_NAMES = {
    "tables": (re.compile(r"[0-9a-f]{32}"), re.compile(r"\.[0-9a-f]{32}\..+")),
    "report": (re.compile(r"[0-9a-f]{32}\.json"), re.compile(r"\.[0-9a-f]{32}\..+\.tmp")),
}


def entries(root: Path | None = None) -> list[CacheEntry]:
    """Every entry of the cache, most recently used first."""
    root = root or cache_root()
    out = []
    places = [(root, "tables"), (root / "reports", "report")]
    for folder, kind in places:
        try:
            items = list(folder.iterdir())
        except OSError:
            continue
        whole, partial = _ENTRY_NAMES[kind]
        for p in items:
            try:
                if whole.fullmatch(p.name) and p.is_dir() == (kind == "tables"):
                    k = kind
                elif partial.fullmatch(p.name):
                    k = "partial"
                else:
                    continue
                out.append(CacheEntry(p, k, _size(p), p.stat().st_mtime))
            except OSError:  # removed meanwhile by another run
                continue
    return sorted(out, key=lambda e: -e.used)


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    else:
        try:
            p.unlink()
        except OSError:
            pass


def max_bytes() -> int:
    try:
        return int(float(os.environ.get("PROFLAB_CACHE_MAX_MB", "4096")) * 1e6)
    except ValueError:
        return int(4096e6)


def trim(root: Path | None = None, limit: int | None = None) -> int:
    """Remove least recently used entries until the cache holds at most ``limit`` bytes
    (default ``max_bytes()``), and temporary entries left by killed runs. Returns the bytes
    removed. Never raises: the cache is an optimisation."""
    limit = max_bytes() if limit is None else limit
    removed = 0
    try:
        now = time.time()
        items = entries(root)
        total = sum(e.bytes for e in items if e.kind != "partial")
        for e in items:
            if e.kind == "partial" and now - e.used > _STALE_TMP_S:
                _remove(e.path)
                removed += e.bytes
        for e in reversed([e for e in items if e.kind != "partial"]):  # least recently used first
            if total <= limit:
                break
            _remove(e.path)
            total -= e.bytes
            removed += e.bytes
    except OSError:
        pass
    return removed


def clear(root: Path | None = None) -> tuple[int, int]:
    """Remove every entry (a write in progress by another run is left alone).
    Returns (entries, bytes) removed."""
    n = size = 0
    for e in entries(root):
        if e.kind == "partial":
            continue
        _remove(e.path)
        n += 1
        size += e.bytes
    return n, size
