"""Nsight Systems: is it here, the ``nsys profile`` command line, and the SQLite export.

Command lines are argument lists, never shell strings: a path or argument with spaces or
quotes reaches nsys as it is.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from proflab.collect import Availability

# the SQLite export is the reader's too (it reads a .nsys-rep through it): it lives there
from proflab.readers._nsys_export import INSTALL_HINT, export_argv, export_sqlite, require

__all__ = ["available", "require", "profile_argv", "export_argv", "export_sqlite", "INSTALL_HINT"]


def available() -> Availability:
    """Whether ``nsys`` is on the PATH. Never raises."""
    return Availability(True) if shutil.which("nsys") else Availability(False, INSTALL_HINT)


def profile_argv(
    nsys: str,
    output: str | Path,
    cmd: list[str],
    *,
    capture_range: bool = False,
    python_backtrace: bool = False,
) -> list[str]:
    """``nsys profile`` as the seeds recommend: CUDA, NVTX and OS runtime traced, CUDA memory
    usage on; with ``capture_range``, recording only between cudaProfilerStart and Stop
    (``proflab.capture()``, or the program's own calls: ``--capture cuda-profiler-api``); with ``python_backtrace``, the Python stack of each CUDA call
    and Python sampling. ``output`` is the report path without ``.nsys-rep``."""
    argv = [
        nsys, "profile",
        "--trace=cuda,nvtx,osrt",
        "--cuda-memory-usage=true",
        f"--output={output}",
        "--force-overwrite=true",
    ]  # fmt: skip
    if capture_range:
        argv += ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
    if python_backtrace:
        argv += ["--python-backtrace=cuda", "--python-sampling=true"]
    return argv + list(cmd)
