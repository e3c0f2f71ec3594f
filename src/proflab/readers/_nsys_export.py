"""Nsight Systems' SQLite export of an ``.nsys-rep`` report: the reader reads a report
through it (``nsys_sqlite``) and ``proflab run --backend nsys`` exports the report it made
(``collect.nsys``, which re-exports these). Command lines are argument lists, never shell
strings.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from proflab.errors import BackendUnavailable, CollectError

__all__ = ["INSTALL_HINT", "require", "export_argv", "export_sqlite"]

INSTALL_HINT = (
    "Nsight Systems (nsys) is not on the PATH. It ships with the CUDA Toolkit (add the toolkit's "
    "bin/ folder to PATH), as the nsight-systems package in NVIDIA's CUDA apt/dnf repositories, "
    "or as a standalone installer from NVIDIA's Nsight Systems download page; "
    "or drop --backend nsys to profile with torch.profiler"
)
_EXPORT_TIMEOUT_S = 1800


def require() -> str:
    """The path of ``nsys``, or :class:`BackendUnavailable` saying how to install it."""
    path = shutil.which("nsys")
    if not path:
        raise BackendUnavailable(INSTALL_HINT)
    return path


def export_argv(nsys: str, report: str | Path, sqlite: str | Path) -> list[str]:
    return [nsys, "export", "--type=sqlite", f"--output={sqlite}", "--force-overwrite=true", str(report)]


def export_sqlite(report: str | Path, sqlite: str | Path | None = None) -> Path:
    """Export an ``.nsys-rep`` report to SQLite beside it (or at ``sqlite``)."""
    report = Path(report)
    sqlite = Path(sqlite) if sqlite else report.with_suffix(".sqlite")
    # nsys writes as it goes: export into a side folder and rename, so an interrupted export
    # never leaves a half-written .sqlite where readers look
    nsys = require()
    partial = sqlite.parent / f".partial-{os.getpid()}"
    partial.mkdir(parents=True, exist_ok=True)
    tmp = partial / sqlite.name
    argv = export_argv(nsys, report, tmp)
    try:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=_EXPORT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CollectError(f"{report}: nsys export failed: {e}") from e
        if done.returncode != 0 or not tmp.exists():
            tail = " ".join((done.stderr or done.stdout or "").split())[-300:]
            raise CollectError(f"{report}: nsys export exited {done.returncode}: {tail}")
        os.replace(tmp, sqlite)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return sqlite
