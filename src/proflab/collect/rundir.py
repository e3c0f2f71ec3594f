"""Run directories: where one profiled run leaves everything, and the list of past runs.

Layout of ``proflab-runs/<YYYYmmdd-HHMMSS>-<name>/``::

    meta.json          command, cwd, exit status, times, versions, GPU/driver/CUDA, git commit,
                       options, the files below; "status": running | finished | interrupted
    traces/            torch.profiler traces, one per process (<host>_<pid>.pt.trace.json.gz),
                       or the Nsight Systems report and its SQLite export
    monitor.parquet    GPU monitor samples (see proflab.collect.monitor for the columns)
    events.jsonl       DetailedProfiler / proflab.record events, one JSON object a line
    processes/         one JSON per profiled process: torch version, steps seen, the window
    analysis.json      the proflab.report/1 analysis of the trace(s); a torchrun job's
                       proflab.job/1 job report (its ranks' reports inside)
    summary.txt        the terminal summary printed at the end of the run

Every file is written through a temporary file and a rename, so a reader never sees half a
file, and ``meta.json`` exists from the moment the run starts: a run that crashes or is
interrupted still leaves a readable directory.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proflab._io import atomic_path, write_atomic
from proflab.errors import UsageError
# what its readers take from a run directory is the readers' (readers.rundir): re-exported here
from proflab.readers.rundir import META, step_times_of, unprofiled_step_ms, unprofiled_steps_ms

__all__ = [
    "DEFAULT_ROOT",
    "RunInfo",
    "atomic_path",
    "write_json",
    "write_text",
    "new_run_dir",
    "list_runs",
    "read_meta",
]

DEFAULT_ROOT = "proflab-runs"


def write_text(path: str | Path, text: str) -> Path:
    return write_atomic(path, text)


def write_json(path: str | Path, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def _slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return s[:48] or "run"


def new_run_dir(root: str | Path = DEFAULT_ROOT, name: str = "run", *, now: float | None = None) -> Path:
    """Create ``root/<YYYYmmdd-HHMMSS>-<name>/`` (``-2``, ``-3``... when it exists)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    root = Path(root)
    base = f"{stamp}-{_slug(name)}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        for i in range(1, 1000):
            path = root / (base if i == 1 else f"{base}-{i}")
            try:
                path.mkdir()
                return path
            except FileExistsError:
                continue
    except OSError as e:
        raise UsageError(f"{root}: cannot make a run directory there ({e.strerror or e})") from e
    raise UsageError(f"{root}: too many runs named {base}")


def read_meta(run_dir: str | Path) -> dict[str, Any] | None:
    """A run's meta.json, or None when it has none, it does not parse or is not an object."""
    try:
        meta = json.loads((Path(run_dir) / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


@dataclass(frozen=True)
class RunInfo:
    """One past run as ``proflab runs`` lists it. Times are local, durations in s."""

    path: Path
    started: str | None
    name: str
    command: str
    status: str
    exit_status: int | None
    duration_s: float | None
    top_finding: str | None


def list_runs(root: str | Path = DEFAULT_ROOT) -> list[RunInfo]:
    """Every run directory under ``root`` that has a meta.json, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    try:
        dirs = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError as e:
        raise UsageError(f"{root}: cannot list the runs ({e.strerror or e})") from e
    runs = []
    for d in dirs:
        meta = read_meta(d)
        if meta is None:
            continue
        # meta.json may come from another proflab version or a hand edit: a field of the
        # wrong type reads as missing rather than breaking the listing.
        cmd = meta.get("command") or []
        analysis = meta.get("analysis")
        exit_status = meta.get("exit_status")
        duration = meta.get("duration_s")
        runs.append(
            RunInfo(
                path=d,
                started=_str(meta.get("started")),
                name=_str(meta.get("name")) or d.name,
                command=" ".join(map(str, cmd)) if isinstance(cmd, list) else str(cmd),
                status=_str(meta.get("status")) or "?",
                exit_status=exit_status if type(exit_status) is int and -(2**31) <= exit_status < 2**31 else None,
                duration_s=_seconds(duration),
                top_finding=_str(analysis.get("top_finding")) if isinstance(analysis, dict) else None,
            )
        )
    return runs


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _seconds(v: Any) -> float | None:
    """A duration as meta.json holds it, or None for another type or a number no float holds
    finitely (an integer of 400 digits)."""
    if type(v) not in (int, float) or (type(v) is int and abs(v) > 2**63):
        return None
    return float(v) if math.isfinite(v) else None
