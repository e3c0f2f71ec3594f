"""`proflab analyze` in a child process, with its peak RSS: what the memory tests assert on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_PROBE = (
    "import resource, subprocess, sys\n"
    "r = subprocess.run([sys.executable, '-m', 'proflab', 'analyze', *sys.argv[3:], sys.argv[1], '-f', 'json', '-o', sys.argv[2], '--no-cache'])\n"
    "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def analyze_peak(trace: Path, report: Path, *args: str, timeout: float = 600) -> tuple[int, int, str]:
    """(exit status, peak RSS in bytes, stderr) of ``proflab analyze TRACE -f json -o REPORT
    --no-cache ARGS`` run by a probe process: the peak is the largest of proflab and any
    helper process it waits for (``RUSAGE_CHILDREN``), Linux reporting KiB."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the proflab under test
    r = subprocess.run([sys.executable, "-c", _PROBE, str(trace), str(report), *args], capture_output=True, text=True,
                       timeout=timeout, env=env)
    rc, maxrss_kib = map(int, r.stdout.split())
    return rc, maxrss_kib * 1024, r.stderr
