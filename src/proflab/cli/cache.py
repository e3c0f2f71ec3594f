"""``proflab cache``: list or clear the cache of large traces' tables and reports."""

from __future__ import annotations

import argparse

__all__ = ["add_parsers", "cmd_cache"]


def add_parsers(sub) -> None:
    ca = sub.add_parser(
        "cache",
        help="list or clear the cache of large traces' tables and reports",
        description=("Large traces (16 MB and more) are kept as columnar tables after their first read, and their "
                     "reports after each analysis, in $PROFLAB_CACHE_DIR (default ~/.cache/proflab), trimmed to "
                     "$PROFLAB_CACHE_MAX_MB (default 4096), least recently used first. Without options: where it is "
                     "and what it holds."),
    )
    cg = ca.add_mutually_exclusive_group()
    cg.add_argument("--list", action="store_true", help="every entry, most recently used first")
    cg.add_argument("--clear", action="store_true", help="remove every entry")
    ca.set_defaults(func=cmd_cache)


def cmd_cache(args: argparse.Namespace) -> int:
    import time

    from proflab.readers import _cachedir

    root = _cachedir.cache_root()
    if args.clear:
        n, size = _cachedir.clear(root)
        print(f"removed {n} entries ({size / 1e6:.1f} MB) from {root}")
        return 0
    items = [e for e in _cachedir.entries(root) if e.kind != "partial"]
    total = sum(e.bytes for e in items)
    print(f"{root}: {len(items)} entries, {total / 1e6:.1f} MB (limit {_cachedir.max_bytes() / 1e6:.0f} MB)")
    if args.list:
        for e in items:
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.used))
            print(f"  {used}  {e.kind:<7} {e.bytes / 1e6:>9.1f} MB  {e.path.name}")
    return 0
