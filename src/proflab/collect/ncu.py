"""Run a program under Nsight Compute, profiling only the kernels that matter.

The kernels come from the timeline (the hot-kernel table): ncu is told their function names
(``--kernel-name-base function``, an anchored regex), to skip past warm-up launches and to
profile one steady-state step's worth of them, with a targeted section list and
``--clock-control none``. The report is written with ``-o`` and exported to the raw and
details CSV pages beside it, which is what proflab then reads.

Every argv is a list; nothing here builds a shell string.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from proflab._env import user_environ
from proflab._io import write_atomic
from proflab.collect import Availability
from proflab.errors import ProflabError, UsageError

__all__ = [
    "DEFAULT_SECTIONS", "NcuPlan", "NcuRun", "available", "plan_from_trace", "build_argv", "run_ncu",
    "NcuMissing", "CounterPermission", "NoKernelsProfiled", "NcuFailed",
]

# Speed of light, occupancy and launch configuration, warp states, the memory hierarchy
# (with the access-pattern tables), source counters (coalescing, divergence) and the
# roofline sections whose metrics the hierarchical roofline needs. Local memory needs no
# section of its own: MemoryWorkloadAnalysis_Tables brings the local load/store sectors and
# instructions, MemoryWorkloadAnalysis the spill requests, SourceCounters the spill
# instructions, LaunchStats the stack size (ncu 2025.3 has no "bytes per wavefront spill"
# metric to ask for).
DEFAULT_SECTIONS = (
    "SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats", "ComputeWorkloadAnalysis",
    "MemoryWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables", "SourceCounters",
    "SpeedOfLight_RooflineChart", "SpeedOfLight_HierarchicalSingleRooflineChart",
    "SpeedOfLight_HierarchicalHalfRooflineChart", "SpeedOfLight_HierarchicalDoubleRooflineChart",
    "SpeedOfLight_HierarchicalTensorRooflineChart",
)
MAX_LAUNCHES = 50  # per run, unless asked: each profiled launch replays the kernel tens of times
PERMISSION_HELP = (
    "ncu was refused access to the GPU performance counters (ERR_NVGPUCTRPERM): by default only "
    "admin users may read them. Fixes: run the profiler as root (sudo -E ncu ...); or let all users "
    "profile: put 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' in /etc/modprobe.d/ and "
    "reload the driver (or reboot); in a container, run it with --cap-add SYS_ADMIN. "
    "See https://developer.nvidia.com/ERR_NVGPUCTRPERM"
)


class NcuMissing(ProflabError):
    """ncu is not installed or not on the PATH."""


class CounterPermission(ProflabError):
    """ERR_NVGPUCTRPERM: the driver does not let this user read the counters."""


class NoKernelsProfiled(ProflabError):
    """The kernel filter matched no launch."""


class NcuFailed(ProflabError):
    """ncu ran but failed; the message holds its last error line."""


@dataclass(frozen=True)
class NcuAvailability(Availability):
    path: str | None = None
    version: str | None = None


def available() -> NcuAvailability:
    """Whether ncu can be run here; never raises."""
    exe = shutil.which("ncu")
    if exe is None:
        return NcuAvailability(False, "ncu is not on the PATH (install Nsight Compute: it ships with the CUDA toolkit)")
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return NcuAvailability(False, f"ncu --version failed: {e}", exe)
    m = re.search(r"Version (\S+)", out)
    return NcuAvailability(True, "", exe, m.group(1) if m else None)


@dataclass(frozen=True)
class NcuPlan:
    """What to profile: function names (ncu's ``function`` name base), launches to skip and
    to profile, and where they came from."""

    functions: tuple[str, ...]
    launch_skip: int
    launch_count: int
    kernels: tuple[str, ...] = ()  # the timeline names behind ``functions``
    notes: tuple[str, ...] = field(default=())

    @property
    def regex(self) -> str:
        return "regex:^(" + "|".join(re.escape(f) for f in self.functions) + ")$"


def plan_from_trace(trace, *, top: int = 5, kernel_regex: str | None = None, warmup_steps: int = 2,
                    launch_skip: int | None = None, launch_count: int | None = None) -> NcuPlan:
    """The hot kernels of ``trace`` (top ``top`` by GPU time, or those matching
    ``kernel_regex``) as an ncu plan. Without explicit skip/count: skip ``warmup_steps``
    steps' worth of matching launches and profile one step's worth (at most MAX_LAUNCHES)."""
    from proflab.analysis.context import Context
    from proflab.analysis.deepdive.verdicts import base_function_name

    ctx = Context(trace)
    hot = ctx.hot_kernels(10_000)
    rows = hot.filter(~hot["is_comm"]).to_dicts()
    if kernel_regex:
        try:
            pat = re.compile(kernel_regex)
        except re.error as e:
            raise UsageError(f"-k {kernel_regex!r} is not a valid regular expression: {e}") from e
        chosen = [r for r in rows if pat.search(r["name"])]
        if not chosen:
            seen = ", ".join(base_function_name(r["name"]) for r in rows[:10])
            raise NoKernelsProfiled(f"-k {kernel_regex!r} matches no kernel in the trace; its hottest kernels are: {seen}")
    else:
        chosen = rows[:top]
    if not chosen:
        raise UsageError("the trace has no GPU kernels to profile")
    functions = tuple(dict.fromkeys(base_function_name(r["name"]) for r in chosen))
    fset = set(functions)
    matching = sum(r["count"] for r in rows if base_function_name(r["name"]) in fset)
    steps = max(trace.steps.height, 1)
    per_step = max(1, round(matching / steps))
    notes = []
    if launch_count is None:
        launch_count = min(per_step, MAX_LAUNCHES)
        if per_step > MAX_LAUNCHES:
            notes.append(f"{per_step} matching launches per step; profiling the first {MAX_LAUNCHES} (--launch-count to change)")
    if launch_skip is None:
        # without steps the trace's launches are not a per-step count: skip nothing
        launch_skip = per_step * warmup_steps if trace.steps.height else 0
    return NcuPlan(functions, launch_skip, launch_count, tuple(r["name"] for r in chosen), tuple(notes))


def build_argv(exe: str, plan: NcuPlan, cmd: list[str], report_base: Path, *, sections: tuple[str, ...] | None = None,
               full: bool = False, replay_mode: str | None = None, nvtx_include: list[str] | None = None,
               extra: list[str] | None = None) -> list[str]:
    if not cmd:
        raise UsageError("no program to run: give it after --, e.g. proflab kernels run/ -- python train.py")
    argv = [exe, "--clock-control", "none", "--target-processes", "all", "--kernel-name-base", "function",
            "-k", plan.regex, "--launch-skip", str(plan.launch_skip), "--launch-count", str(plan.launch_count)]
    if full:
        argv += ["--set", "full"]
    else:
        for s in sections or DEFAULT_SECTIONS:
            argv += ["--section", s]
    if replay_mode:
        argv += ["--replay-mode", replay_mode]
    if nvtx_include:
        argv += ["--nvtx"]
        for n in nvtx_include:
            argv += ["--nvtx-include", n]
    argv += list(extra or [])
    argv += ["--import-source", "no", "-f", "-o", str(report_base), *cmd]
    return argv


@dataclass(frozen=True)
class NcuRun:
    report: Path
    raw_csv: Path
    details_csv: Path
    log: Path
    argv: tuple[str, ...]
    returncode: int
    timed_out: bool
    wall_s: float


def run_ncu(argv: list[str], out_dir: Path, *, timeout_s: float | None = None) -> NcuRun:
    """Run ``argv`` (from :func:`build_argv`), logging its output to ``out_dir/ncu.log``, then
    export the report's raw and details pages. On timeout ncu is interrupted (SIGINT, as a
    user's Ctrl-C), which makes it stop the program and save what it profiled so far."""
    out_dir.mkdir(parents=True, exist_ok=True)
    report_base = Path(argv[argv.index("-o") + 1])
    report = report_base.with_name(report_base.name + ".ncu-rep")
    log = out_dir / "ncu.log"
    t0 = time.perf_counter()
    timed_out = False
    with open(log, "w") as f:
        try:
            # the program under ncu gets the user's environment, not proflab's own tuning
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=user_environ())
        except OSError as e:
            raise NcuMissing(f"cannot start ncu ({argv[0]}): {e.strerror}") from e
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGINT)
            try:
                rc = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=120)
            raise
    wall = time.perf_counter() - t0
    text = log.read_text(errors="replace")
    if "ERR_NVGPUCTRPERM" in text:
        raise CounterPermission(PERMISSION_HELP)
    if not report.exists():
        if "No kernels were profiled" in text:
            raise NoKernelsProfiled("ncu profiled no kernel: the filter matched no launch after the skip")
        errs = [line for line in text.splitlines() if line.startswith("==ERROR==")]
        why = errs[-1] if errs else (text.strip().splitlines() or [f"exit status {rc}"])[-1]
        raise NcuFailed(f"ncu wrote no report ({why.strip()}); full log: {log}")
    from proflab.readers.ncu import export_pages

    raw, details = export_pages(report, argv[0])
    raw_csv, details_csv = out_dir / "raw.csv", out_dir / "details.csv"
    for path, content in ((raw_csv, raw), (details_csv, details)):
        write_atomic(path, content)
    return NcuRun(report, raw_csv, details_csv, log, tuple(argv), rc, timed_out, wall)
