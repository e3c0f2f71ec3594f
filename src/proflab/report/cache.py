"""The report cache: the analysis of a large trace, kept so that analysing it again is instant.

A repeated ``proflab analyze`` of an unchanged trace with the same options gets the report
it got before, read from one JSON file, without importing or reading any table. The key
holds the trace's own key (resolved path, size, modification time, reader version: the
columnar cache's, ``readers._cachedir``), a hash of every proflab source (any change to the
code makes new entries), and the options that change the report: the path as given (it is
in the report), ``--top``, the unprofiled step time, ``--steps`` and ``--window``.
``compare`` keeps each side's trace the same way, under its own key, with the small tables a
comparison takes from the trace beside its report (``report.compare.TracePart``), and
``report`` keeps the page's report of one trace with its timeline (``analysis.overview``).

Tuples and dictionaries with keys that are not text are tagged in the JSON, and a report is
kept only when it survives the round trip exactly (same types, same values), so a cached
report renders byte for byte as the fresh one did. A finding's ``fixes`` (what the what-if
replay was given; the report shows their prediction, which is kept) are not kept. It follows
the columnar cache's rules: only traces of at least ``PROFLAB_CACHE_MIN_MB``, never with ``--no-cache`` or ``PROFLAB_NO_CACHE=1``, written under
a temporary name and renamed into place, trimmed with the rest of the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from proflab.readers._cachedir import analysis_version, cache_root, enabled, touch, trace_key, trim
from proflab.report import Finding, Missing, Report

__all__ = ["key", "get", "get_with_extra", "put"]


def key(path: Path, options: dict[str, Any], cache: bool | None) -> str | None:
    """The report's key, or None when the cache is not used for this trace."""
    if not enabled(path, cache):
        return None
    tk = trace_key(path)
    if tk is None:
        return None
    opts = json.dumps({"path": str(path), **options}, sort_keys=True, default=str)
    return hashlib.sha256(f"{tk}\0{analysis_version()}\0{opts}".encode()).hexdigest()[:32]


def _file(k: str) -> Path:
    return cache_root() / "reports" / f"{k}.json"


_TUPLE, _PAIRS = "\u0000tuple", "\u0000pairs"  # JSON has no tuples and only text keys: tagged


def _wrap(v: Any) -> Any:
    if isinstance(v, tuple):
        return {_TUPLE: [_wrap(x) for x in v]}
    if isinstance(v, list):
        return [_wrap(x) for x in v]
    if isinstance(v, dict):
        if all(type(k) is str for k in v):
            return {k: _wrap(x) for k, x in v.items()}
        return {_PAIRS: [[_wrap(k), _wrap(x)] for k, x in v.items()]}
    return v


def _unwrap(d: dict) -> Any:
    if len(d) == 1:
        if _TUPLE in d:
            return tuple(d[_TUPLE])
        if _PAIRS in d:
            return {(tuple(k) if isinstance(k, list) else k): x for k, x in d[_PAIRS]}
    return d


def _encode(report: Report) -> Any:
    out = {}
    for f in dataclasses.fields(Report):
        v = getattr(report, f.name)
        if f.name == "findings":
            v = tuple({g.name: getattr(x, g.name) for g in dataclasses.fields(Finding) if g.name != "fixes"} for x in v)
        elif f.name == "missing":
            v = tuple({"signal": m.signal, "reason": m.reason, "skipped": m.skipped} for m in v)
        out[f.name] = v
    return _wrap(out)


def _decode(d: dict[str, Any]) -> Report:
    kw = dict(d)
    kw["findings"] = tuple(Finding(**f) for f in kw["findings"])
    kw["missing"] = tuple(Missing(**m) for m in kw["missing"])
    return Report(**kw)


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same types (NaN equal to NaN), all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(type(k) is str for k in a) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if dataclasses.is_dataclass(a):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b


def get(k: str | None) -> Report | None:
    """The cached report, or None (a damaged entry is removed)."""
    got = get_with_extra(k)
    return None if got is None else got[0]


def get_with_extra(k: str | None) -> tuple[Report, Any] | None:
    """The cached report and what was kept with it (``put``'s ``extra``; None when nothing),
    or None (a damaged entry is removed)."""
    if k is None:
        return None
    f = _file(k)
    try:
        raw = f.read_bytes()
    except OSError:
        return None
    try:
        d = json.loads(raw, object_hook=_unwrap)
        if d.get("_version") != analysis_version():
            raise ValueError("stale")
        report = _decode(d["report"])
    except Exception:  # any damage: the analysis runs again
        try:
            f.unlink()
        except OSError:
            pass
        return None
    touch(f)
    return report, d.get("extra")


def put(k: str | None, report: Report, extra: dict[str, Any] | None = None) -> bool:
    """Keep ``report`` under ``k`` when it survives the JSON round trip; never raises.
    ``extra``: JSON values kept beside it (a comparison keeps its per-trace tables there)."""
    if k is None:
        return False
    tmp = None
    try:
        encoded = _encode(report)
        text = json.dumps({"_version": analysis_version(), "report": encoded, **({"extra": _wrap(extra)} if extra else {})})
        back = json.loads(text, object_hook=_unwrap)
        kept = dataclasses.replace(report, findings=tuple(dataclasses.replace(x, fixes=()) for x in report.findings))
        if not _same(_decode(back["report"]), kept) or (extra and not _same(back["extra"], extra)):
            return False  # a value JSON cannot carry as it is (a tuple in evidence, a non-text key)
        f = _file(k)
        f.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{k}.", suffix=".tmp", dir=f.parent)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, f)  # atomic: a concurrent reader sees the whole report or none
        tmp = None
        trim()
        return True
    except Exception:
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
