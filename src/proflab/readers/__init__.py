"""Readers: one module per input format. Each sniffs its format and raises on bad input.

``load(path)`` picks the reader: Kineto (torch.profiler) JSON, plain or gzip; Nsight Systems
SQLite exports, and ``.nsys-rep`` reports through ``nsys export``.
"""

from __future__ import annotations

from pathlib import Path

from proflab.errors import InputNotFound, UnsupportedFormat

__all__ = ["load", "expand_paths"]

_TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep")


def expand_paths(paths: list[str | Path]) -> list[Path]:
    """Files as given, and trace files inside directories (a tensorboard_trace_handler folder)."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            # a `proflab run` directory keeps its traces in traces/, beside meta.json and the
            # analysis (which is JSON too, but not a trace)
            if (p / "meta.json").is_file() and (p / "traces").is_dir():
                p = p / "traces"
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(_TRACE_SUFFIXES))
            if not found:
                raise InputNotFound(p, "directory holds no trace files (*.json, *.json.gz)")
            out.extend(found)
        elif p.exists():
            out.append(p)
        else:
            raise InputNotFound(p, "no such file or directory")
    return out


def load(path: str | Path):
    """Read one trace file into a :class:`proflab.model.Trace`."""
    from proflab.readers import kineto, nsys_sqlite

    p = Path(path)
    if not p.exists():
        raise InputNotFound(p, "no such file or directory")
    if p.is_dir():
        raise UnsupportedFormat(p, "is a directory; pass one trace file (or use expand_paths)")
    if nsys_sqlite.sniff(p) or p.suffix == ".nsys-rep":
        return nsys_sqlite.read(p)
    if kineto.sniff(p):
        return kineto.read(p)
    raise UnsupportedFormat(
        p,
        "not a format proflab reads (expected a torch.profiler/Kineto trace: JSON or JSON.gz; "
        "or an Nsight Systems export: .sqlite or .nsys-rep)",
    )
