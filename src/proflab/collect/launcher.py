"""``proflab run``: profile an unmodified program, then analyse what was recorded.

The program runs as a child process with proflab's bootstrap folder first on its PYTHONPATH
(see ``_child.py`` for what happens inside it). This process stays outside the profiled one:
it samples the GPUs through NVML, forwards SIGINT/SIGTERM, waits, writes the run directory
(``rundir.py`` has the layout), analyses the trace(s) and exits with the program's status
(128 + N when a signal N ended it: 130 for Ctrl-C; 124 when a process of it hung at exit and
was ended: ``exitwatch.py``).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from proflab._version import __version__
from proflab._env import user_environ
from proflab.collect import defaults, rundir
from proflab.collect.exitwatch import HUNG_AT_EXIT, TERM_GRACE_S, ExitWatch
from proflab.errors import ProflabError, UsageError

__all__ = ["RunOptions", "run", "finalize", "analyze_run", "exit_status"]

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_bootstrap"
WINDOWS = ("auto", "steps", "time", "capture", "none")  # none: no profiler, the steps timed (proflab try)
BACKENDS = ("torch", "nsys")
# --capture: whose ranges set the window instead of steps or time. cuda-profiler-api: the program's
# cudaProfilerStart/Stop (torch.cuda.profiler.start()/stop(), torch.cuda.cudart().cudaProfilerStart(),
# TensorRT-LLM's TLLM_PROFILE_START_STOP iterations)
CAPTURES = ("cuda-profiler-api",)


@dataclass(frozen=True)
class RunOptions:
    """What ``proflab run`` records. Steps count optimizer steps or ``proflab.step()`` calls;
    times are in seconds."""

    backend: str = "torch"
    root: str = rundir.DEFAULT_ROOT
    name: str | None = None
    window: str = "auto"
    wait: int = 3  # steps skipped before recording (compilation, autotuning, allocator warm-up)
    warmup: int = 1  # steps the profiler runs but discards (its own start-up cost)
    active: int = 5  # steps recorded
    delay_s: float = 5.0  # time window: starts this long after the torch import...
    duration_s: float = 10.0  # ...and lasts this long
    record_shapes: bool = defaults.RECORD_SHAPES  # (collect/defaults.py says why)
    count_flops: bool = defaults.COUNT_FLOPS  # one unprofiled step under torch.utils.flop_counter
    with_stack: bool = defaults.WITH_STACK
    profile_memory: bool = False
    memory_snapshot: bool = False
    capture_range: bool = False
    capture: str | None = None  # one of CAPTURES: the program's own ranges set the window
    python_backtrace: bool = False
    monitor: bool | None = None  # None: on when a GPU is present
    monitor_period_s: float = 0.1
    exit_timeout_s: float = 60.0  # a process not ended this long after its main thread did is hung (0: never)
    knobs: tuple = ()  # proflab try's fixes (collect/knobs.py), set in the program
    analyze: bool = True
    top: int = 15
    width: int | None = None
    color: bool = False

    def check(self) -> None:
        if self.backend not in BACKENDS:
            raise UsageError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.window not in WINDOWS:
            raise UsageError(f"unknown window {self.window!r}; choose one of {', '.join(WINDOWS)}")
        if self.capture is not None:
            if self.capture not in CAPTURES:
                raise UsageError(f"unknown capture {self.capture!r}; choose one of {', '.join(CAPTURES)}")
            if self.window != "auto" or self.capture_range:
                raise UsageError(f"--capture {self.capture} sets the window itself (the program's cudaProfilerStart/Stop "
                                 "range): leave out --window and --capture-range")
        if self.wait < 0 or self.warmup < 0 or self.active < 1:
            raise UsageError("--wait and --warmup must be >= 0 and --active >= 1")
        if self.delay_s < 0 or self.duration_s <= 0:
            raise UsageError("--delay must be >= 0 s and --duration > 0 s")
        if self.monitor_period_s <= 0:
            raise UsageError("--monitor-period must be > 0 s")
        if self.exit_timeout_s < 0:
            raise UsageError("--exit-timeout must be >= 0 s (0: wait for ever)")
        if self.top < 0:
            raise UsageError("--top must be >= 0")


def exit_status(returncode: int) -> int:
    """A child's return code as a shell reports it: 128 + N for death by signal N."""
    return returncode if returncode >= 0 else 128 - returncode


def _run_name(cmd: list[str]) -> str:
    """``train`` for ``python train.py``, ``mymod`` for ``python -m mymod``, else the program."""
    prog = Path(cmd[0]).name
    if prog.startswith("python") or prog in ("torchrun", "accelerate", "deepspeed"):
        args = iter(cmd[1:])
        for a in args:
            if a == "-m":
                return next(args, prog).rsplit(".", 1)[-1]
            if a.endswith(".py"):
                return Path(a).stem
    return prog


def _child_config(opts: RunOptions, run_dir: Path) -> dict[str, Any]:
    cfg = {
        "run_dir": str(run_dir),
        "backend": opts.backend,
        "window": opts.capture or ("capture" if opts.capture_range else opts.window),
        "wait": opts.wait,
        "warmup": opts.warmup,
        "active": opts.active,
        "delay_s": opts.delay_s if opts.window in ("auto", "time") and opts.capture is None else None,
        "duration_s": opts.duration_s,
        "record_shapes": opts.record_shapes,
        "count_flops": opts.count_flops,
        "with_stack": opts.with_stack,
        "profile_memory": opts.profile_memory,
        "memory_snapshot": opts.memory_snapshot,
    }
    if opts.knobs:
        from proflab.collect.knobs import runtime_settings

        cfg["knobs"] = runtime_settings(list(opts.knobs))
    return cfg


class _Signals:
    """Forward SIGINT/SIGTERM to the child while it runs.

    In a terminal, Ctrl-C reaches the whole foreground process group: the child has it
    already, and a second one could cut its trace export short. So SIGINT is forwarded only
    when this process is not in the terminal's foreground group (``kill -INT`` from elsewhere,
    a batch system), and always from the second one on.
    """

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.received: list[int] = []
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handle(self, signum, frame) -> None:
        self.received.append(signum)
        if signum == signal.SIGINT and self.received.count(signal.SIGINT) == 1 and _foreground():
            return
        try:
            self.proc.send_signal(signum)
        except ProcessLookupError:
            pass


def _hear_sigint() -> None:
    """Let the program hear the SIGINT proflab forwards. A command started in the background of
    a script (``cmd &``, as batch and CI jobs do) or under some service managers inherits SIGINT
    ignored, and an ignored signal stays ignored across exec: ``kill -INT`` to proflab then
    reached a program that could not hear it, and proflab waited on it for ever. A handled
    signal is reset to its default at exec, so the program starts with Python's
    KeyboardInterrupt (or the default action) as if run from a shell."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _foreground() -> bool:
    """Whether this process is in the foreground process group of its controlling terminal."""
    for fd in (0, 1, 2):
        try:
            return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


def run(cmd: list[str], opts: RunOptions = RunOptions(), *, out=sys.stdout) -> int:
    """Profile ``cmd``; returns its exit status. Raises ProflabError for proflab's own failures
    (bad options, a missing backend) before the program starts."""
    opts.check()
    if not cmd:
        raise UsageError("give the command to profile after --, e.g. proflab run -- python train.py")
    if shutil.which(cmd[0]) is None:
        raise UsageError(f"{cmd[0]}: command not found")
    nsys_path = None
    if opts.backend == "nsys":
        from proflab.collect import nsys

        nsys_path = nsys.require()

    run_dir = rundir.new_run_dir(opts.root, opts.name or _run_name(cmd))
    (run_dir / "traces").mkdir()
    started = time.time()
    meta: dict[str, Any] = {
        "schema": "proflab.run/1",
        "name": opts.name or _run_name(cmd),
        "command": list(cmd),
        "cwd": os.getcwd(),
        "status": "running",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "exit_status": None,
        "options": asdict(opts),
        "notes": [],
    }
    rundir.write_json(run_dir / rundir.META, meta)

    monitor = _start_monitor(opts, meta)
    env = user_environ()  # the user's, without proflab's own tuning of its analysis
    env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP_DIR), *filter(None, [env.get("PYTHONPATH")])])
    env["PROFLAB_RUN_CONFIG"] = json.dumps(_child_config(opts, run_dir))
    # Kineto leaves CUPTI initialised after a profiler stops unless told to tear it down,
    # and every later kernel launch pays for it: on an H100 (PyTorch 2.11, CUDA 13) a
    # per-parameter-optimizer loop ran 1.20-1.36x slower after one profiled window, 0.97x
    # with TEARDOWN_CUPTI=1; a second window still records every kernel. torch itself turns
    # teardown off where CUDA graphs need it (CUDA < 12.6). The program's own setting wins.
    env.setdefault("TEARDOWN_CUPTI", "1")
    env["PROFLAB_RUN_DIR"] = str(run_dir)
    if opts.knobs:
        from proflab.collect.knobs import environment

        env = environment(list(opts.knobs), env)
    argv = list(cmd)
    if nsys_path:
        from proflab.collect import nsys

        argv = nsys.profile_argv(
            nsys_path, run_dir / "traces" / "report", cmd,
            capture_range=opts.capture_range or opts.window == "capture" or opts.capture == "cuda-profiler-api",
            python_backtrace=opts.python_backtrace,
        )  # fmt: skip
    t0 = time.perf_counter()
    _hear_sigint()
    try:
        proc = subprocess.Popen(argv, env=env)
    except OSError as e:
        if monitor:
            monitor.stop()
        meta["status"] = "failed to start"
        meta["notes"].append(f"{cmd[0]}: {e}")
        rundir.write_json(run_dir / rundir.META, meta)
        raise UsageError(f"{cmd[0]}: cannot start: {e}") from e
    with _Signals(proc) as sigs:
        returncode, hung = _wait(proc, run_dir, opts.exit_timeout_s)
    status = exit_status(returncode)
    meta["duration_s"] = round(time.perf_counter() - t0, 3)
    meta["exit_status"] = status
    meta["status"] = "interrupted" if sigs.received or returncode < 0 else "finished"
    if sigs.received:
        meta["signals"] = [signal.Signals(s).name for s in sigs.received]
    if hung:
        meta["status"], meta["exit_status"], status = "hung at exit", HUNG_AT_EXIT, HUNG_AT_EXIT
        meta["program_exit_status"] = exit_status(returncode)  # what ending it left
        meta["hung_at_exit"] = [asdict(h) for h in hung]
        meta["notes"] += [
            f"{h.line()}; proflab ended it ({'SIGKILL' if h.saved else 'SIGTERM, then SIGKILL'}) and kept what it had recorded "
            f"(--exit-timeout {opts.exit_timeout_s:g} s)"
            for h in hung
        ]  # fmt: skip
    rundir.write_json(run_dir / rundir.META, meta)  # the program's outcome, before anything else can fail

    try:
        if nsys_path:
            _export_nsys(run_dir, meta)
        finalize(run_dir, meta, monitor=monitor)
        if opts.analyze:
            text, _ = analyze_run(run_dir, meta, top=opts.top, width=opts.width, color=opts.color)
        else:  # where the run went, how it ended and its step times, without the analysis
            text = _run_header(run_dir, meta) + f"  analyse it: proflab analyze {run_dir}\n"
        out.write(text)
        out.flush()
    except KeyboardInterrupt:  # Ctrl-C after the program ended, while proflab was finishing
        if monitor is not None:
            monitor.stop()
        meta["notes"].append(
            "Ctrl-C while proflab was finishing the run: what was collected is kept; "
            f"`proflab analyze {run_dir}` analyses it"
        )
        rundir.write_json(run_dir / rundir.META, meta)
        sys.stderr.write(f"proflab: interrupted while finishing; the run is in {run_dir}\n")
        return 130
    return status


def _wait(proc: subprocess.Popen, run_dir: Path, exit_timeout_s: float) -> tuple[int, list]:
    """Wait for the program; a process of it that hangs at exit (``exitwatch``) is ended, and
    the program itself too if it still has not ended once those are gone (a launcher such as
    torchrun waiting on a hung worker ends by itself; anything else gets the same grace).
    Returns the program's return code and the processes found hung."""
    watch = ExitWatch(run_dir, exit_timeout_s)
    gave_up_at = None
    while True:
        try:
            return proc.wait(timeout=0.25), watch.hung
        except subprocess.TimeoutExpired:
            pass
        hung = watch.check()
        if hung:
            watch.end(hung)
            gave_up_at = gave_up_at or time.monotonic()
        if gave_up_at is not None and time.monotonic() - gave_up_at > TERM_GRACE_S and proc.poll() is None:
            proc.kill()


def _start_monitor(opts: RunOptions, meta: dict):
    if opts.monitor is False:
        return None
    from proflab.collect import monitor as m

    a = m.available()
    if not a:
        meta["notes"].append(f"GPU monitor off: {a.reason}")
        return None
    try:
        return m.GPUMonitor(opts.monitor_period_s).start()
    except ProflabError as e:
        meta["notes"].append(f"GPU monitor off: {e}")
        return None


def _export_nsys(run_dir: Path, meta: dict) -> None:
    from proflab.collect import nsys

    rep = run_dir / "traces" / "report.nsys-rep"
    if not rep.exists():
        raw = sorted((run_dir / "traces").glob("*.qdstrm"))
        if raw:  # recorded, but this nsys has no importer to turn the raw stream into a report
            meta["notes"].append(
                f"nsys recorded {raw[0].relative_to(run_dir)} but made no report from it (this nsys lacks its "
                "QdstrmImporter): convert it with QdstrmImporter from a full Nsight Systems install, then run "
                "`proflab analyze` on the .nsys-rep"
            )
        else:
            meta["notes"].append("nsys wrote no report (did the program reach CUDA? with --capture-range or --capture cuda-profiler-api, did it call proflab.capture() or cudaProfilerStart?)")
        return
    try:
        nsys.export_sqlite(rep)
    except ProflabError as e:
        meta["notes"].append(str(e))


def _versions(processes: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {"proflab": __version__, "python": platform.python_version(), "platform": platform.platform()}
    torch = sorted({p["torch"] for p in processes if p.get("torch")})
    if torch:
        out["torch"] = torch[0] if len(torch) == 1 else torch
        cuda = sorted({p["torch_cuda"] for p in processes if p.get("torch_cuda")})
        out["torch_cuda"] = cuda[0] if len(cuda) == 1 else (cuda or None)
    else:
        from importlib import metadata

        try:  # the program did not import torch; say what is installed, without importing it
            out["torch_installed"] = metadata.version("torch")
        except metadata.PackageNotFoundError:
            out["torch_installed"] = None
    return out


def _git(cwd: str) -> dict[str, Any] | None:
    """The commit of the git work tree ``cwd`` is in (and whether it has changes), or None."""
    git = shutil.which("git")
    if not git:
        return None
    try:
        head = subprocess.run([git, "-C", cwd, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            [git, "-C", cwd, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}


def _processes(run_dir: Path) -> list[dict]:
    out = []
    for p in sorted((run_dir / "processes").glob("*.json")):
        try:
            out.append(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return out


def trace_files(run_dir: Path) -> list[Path]:
    """The traces of a run: torch.profiler's, else the Nsight Systems SQLite export."""
    t = run_dir / "traces"
    if not t.is_dir():
        return []
    kineto = sorted(p for p in t.iterdir() if p.is_file() and p.name.endswith((".pt.trace.json.gz", ".pt.trace.json.xz")))
    return kineto or sorted(t.glob("*.sqlite"))


def finalize(run_dir: Path, meta: dict, *, monitor=None) -> dict:
    """Stop the monitor, write monitor.parquet and the final meta.json."""
    if monitor is not None:
        monitor.stop()
        try:
            monitor.write_parquet(run_dir / "monitor.parquet")
            meta["monitor"] = monitor.summary().to_dict()
            meta["monitor"]["errors"] = monitor.errors[:5]
        except Exception as e:  # a broken monitor must not lose the run
            meta["notes"].append(f"monitor samples not written: {type(e).__name__}: {e}")
    procs = _processes(run_dir)
    meta["processes"] = procs
    for p in procs:
        meta["notes"].extend(n for n in p.get("notes", []) if n not in meta["notes"])
    if (meta.get("options") or {}).get("backend", "torch") == "torch":
        if not procs:
            meta["notes"].append("proflab's in-process runtime did not start in the program (its stderr says why)")
        elif not any(p.get("torch") for p in procs):
            meta["notes"].append("the program never imported torch: no torch.profiler trace"
                                 + (interpreter_note(meta.get("command") or [], meta.get("cwd")) or ""))
    meta["versions"] = _versions(procs)
    from proflab.collect import monitor as m

    meta["gpu"] = m.device_info()
    cuda_builds = sorted({p["torch"] for p in procs if p.get("torch") and p.get("torch_cuda")})
    if cuda_builds and not meta["gpu"].get("available"):
        # (a newcomer's `pip install torch` on Linux: every run then printed CUDA's warning unexplained)
        meta["notes"].append(
            f"the program's torch ({', '.join(cuda_builds)}) is a CUDA build, and this machine has no NVIDIA GPU: "
            "its warnings such as 'gpuGetDeviceCount failed with code 35' are CUDA's, not the program's; the CPU "
            "build has none of them and is a fraction of the size (pip install torch with the --index-url "
            "that pytorch.org's install selector gives for the CPU)")
    meta["git"] = _git(meta.get("cwd") or os.getcwd())
    meta["traces"] = [str(p.relative_to(run_dir)) for p in trace_files(run_dir)]
    meta["recorded"] = bool(meta["traces"])
    meta["why_no_trace"] = None if meta["recorded"] else _why_no_trace(meta, procs)
    ev = run_dir / "events.jsonl"
    meta["events"] = 0
    if ev.exists():
        with ev.open(encoding="utf-8") as f:
            meta["events"] = sum(1 for _ in f)
    meta["ended"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    rundir.write_json(run_dir / rundir.META, meta)
    return meta


# Run in the program's interpreter: where it is, and whether torch is there (found, not imported).
_TORCH_THERE = ("import importlib.util, sys; print(sys.prefix); print(sys.executable); "
                "print(importlib.util.find_spec('torch') is not None)")


def program_interpreter(cmd: list[str], cwd: str | None = None) -> str | None:
    """The Python interpreter that ``cmd`` runs in: its first word when that is a Python, or
    the interpreter of its script's ``#!`` line (torchrun, accelerate); None for anything else."""
    if not cmd:
        return None
    exe = shutil.which(cmd[0], path=os.environ.get("PATH")) if os.sep not in cmd[0] else str(Path(cwd or ".") / cmd[0])
    if exe is None:
        return None
    if Path(exe).name.startswith("python"):
        return exe
    try:
        with open(exe, "rb") as f:
            first = f.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!") or "python" not in first:
        return None
    words = first[2:].split()
    if Path(words[0]).name == "env" and len(words) > 1:  # #!/usr/bin/env python3
        return shutil.which(words[-1])
    return words[0]


def interpreter_note(cmd: list[str], cwd: str | None = None) -> str | None:
    """``; it ran in X, which has no torch: ...`` with an interpreter that has it (proflab's
    own, when it does) or how to install it; None when the program's interpreter has torch
    (the program just did not import it) or cannot be told. A newcomer's ``python`` on the
    PATH is often not the environment's, and "never imported torch" alone does not say so."""
    interp = program_interpreter(cmd, cwd)
    if interp is None:
        return None
    try:  # proflab's own environment, without its bootstrap: this must not start a run
        got = subprocess.run([interp, "-c", _TORCH_THERE], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL, env=user_environ(), cwd=cwd)
        prefix, real, has = got.stdout.splitlines()[-3:]
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    if has == "True":
        return None
    import importlib.util

    said = f"`{cmd[0]}`" + (" on the PATH" if os.sep not in cmd[0] else "")
    note = f"; it ran in {real} ({said}), which has no torch"
    # (a venv's python is a link to the base interpreter: environments differ by prefix, not by file)
    if importlib.util.find_spec("torch") is not None and Path(sys.prefix) != Path(prefix):
        rest = cmd[1:] if Path(interp).name.startswith("python") else cmd  # (a #! script: run it with that python)
        import shlex

        return note + f"; proflab's own interpreter has torch: proflab run -- {shlex.join([sys.executable, *rest])}"
    from proflab.collect.doctor import torch_install_fix

    return note + f": {torch_install_fix(real)}"


def _why_no_trace(meta: dict, procs: list[dict]) -> str:
    """One line: why a run holds no trace, from what its processes and the launcher saw."""
    for p in procs:
        if p.get("why_no_trace"):
            return p["why_no_trace"]
    notes = meta.get("notes") or []
    for key in ("runtime did not start", "never imported torch", "nsys recorded", "nsys wrote no report"):
        for n in notes:
            if key in n:
                return n
    if procs and not any(p.get("profiled") for p in procs):
        return "no process of the program was profiled (launcher and worker processes are not)"
    if meta.get("status") == "interrupted":
        return "the program was interrupted before a window was recorded"
    return "no process exported a trace (the notes below say what happened)"


def analyze_run(
    run_dir: Path, meta: dict, *, top: int = 15, width: int | None = None, color: bool = False
) -> tuple[str, list]:
    """Analyse a run's traces: write analysis.json and summary.txt, update meta.json; return
    the terminal summary and the reports (one per trace)."""
    from proflab.render import render

    head = _run_header(run_dir, meta)
    reports, body = [], ""
    traces = trace_files(run_dir)
    try:
        if traces:
            job, reports = _job_of(traces, top)
            if job is None and not reports:
                from proflab.readers import load_trace as load
                from proflab.report.analyze import analyze

                reports = [analyze(load(p), top_kernels=top, bare_step_ms=rundir.unprofiled_step_ms(p)) for p in traces]
            shown = job if job is not None else reports
            rundir.write_text(run_dir / "analysis.json", render(shown, "json"))
            notes = meta.setdefault("notes", [])
            for r in reports:  # --profile-memory: what collecting the allocations cost, in the run's notes
                for n in (getattr(r, "memory", None) or {}).get("notes") or []:
                    if n.startswith("--profile-memory") and n not in notes:
                        notes.append(n)
            body = render(shown, "term", width=width or 80, color=color)
            # the job's own findings that claim a gain first (a straggler, exposed
            # communication), else rank 0's
            f = ([x for x in job.findings if x.est_gain_ms > 0] if job is not None else []) or reports[0].findings
            meta["analysis"] = {
                "reports": len(reports),
                "job": job is not None,
                "top_finding": None if not f else (
                    f[0].category if f[0].category == "healthy"
                    else f"{f[0].category} ({f[0].est_gain_ms:.1f} ms, {f[0].est_gain_pct:.1f}%)"
                ),
            }  # fmt: skip
        else:
            meta["analysis"] = {"reports": 0, "top_finding": None, "note": "no trace was recorded"}
    except ProflabError as e:
        meta["analysis"] = {"reports": 0, "top_finding": None, "error": str(e)}
        body = f"proflab: the analysis failed: {e}\n"
    text = head + body
    rundir.write_text(run_dir / "summary.txt", text)
    rundir.write_json(run_dir / rundir.META, meta)
    return text, reports


def _job_of(traces: list[Path], top: int) -> tuple[Any, list]:
    """(the job report, the ranks' reports) when a run's traces are the ranks of one job
    (torchrun: one trace per rank); (None, the reports already made) when they are not;
    (None, []) for a single trace, unless it is an Nsight Systems export whose processes
    are the ranks. Runs here, without Dask, when Dask is not installed."""
    if len(traces) == 1 and traces[0].suffix == ".sqlite":
        from proflab.report.job import analyze_processes
        from proflab.readers import load_trace as load
        from proflab.report.analyze import analyze

        trace = load(traces[0])
        job = analyze_processes(trace, top_kernels=top)
        if job is not None:
            return job, list(job.reports)
        return None, [analyze(trace, top_kernels=top, bare_step_ms=rundir.unprofiled_step_ms(traces[0]))]
    if len(traces) < 2:
        return None, []
    import importlib.util

    from proflab.report import job as jobs

    try:
        job = jobs.analyze_job(traces, top_kernels=top, in_process=importlib.util.find_spec("distributed") is None)
    except jobs.NotAJob as e:
        return None, [s.report for s in e.summaries]
    return job, list(job.reports)


def _run_header(run_dir: Path, meta: dict) -> str:
    lines = []
    if meta.get("recorded") is False:  # first, before anything else: the run missed
        lines.append(f"proflab run: NO TRACE RECORDED: {meta.get('why_no_trace')}")
    for h in meta.get("hung_at_exit") or []:
        who = f"rank {h['rank']} (pid {h['pid']})" if h.get("rank") is not None else f"pid {h['pid']}"
        lines.append(f"proflab run: HUNG AT EXIT: {who}, waiting for {h['waiting_for']}; ended after {h['waited_s']:.0f} s")
    lines += [
        f"proflab run: {run_dir}",
        f"  command: {' '.join(meta.get('command') or [])}",
        f"  exit status {meta.get('exit_status')} ({meta.get('status')}) after {meta.get('duration_s')} s",
    ]
    mon = meta.get("monitor")
    if mon:
        gpm = {k: v for k, v in (mon.get("gpm") or {}).items() if v is not None}
        lines.append(
            f"  GPU monitor: {mon['samples']} samples every {mon['period_s']} s; energy {_value(mon['energy_j'], ' J')}, "
            f"power mean {_value(mon['mean_power_w'], ' W')} / max {_value(mon['max_power_w'], ' W')}, "
            f"GPU util {_value(mon['mean_util_gpu_pct'], '%')}"
        )
        if gpm:
            lines.append("  GPM means: " + ", ".join(f"{k[4:]} {v}" for k, v in gpm.items()))
    if meta.get("traces"):
        lines.append(f"  traces: {', '.join(meta['traces'])}")
    for p in meta.get("processes") or []:
        st = p.get("step_times") or {}
        if st.get("bare_ms") and st.get("profiled_ms"):
            who = f"rank {p['rank']}" if p.get("rank") is not None else f"pid {p.get('pid')}"
            clock = "GPU-side" if st.get("clock") == "gpu" else "host-side"
            lines.append(
                f"  steps ({who}, {clock}): {st['bare_ms']:.2f} ms without the profiler ({st['bare_n']} steps), "
                f"{st['profiled_ms']:.2f} ms while it recorded ({st['profiled_n']}): "
                f"{st['profiled_ms'] / st['bare_ms']:.2f}x, the profiler's own cost; verdicts are judged against the first"
            )
    if meta.get("events"):
        lines.append(f"  events: {meta['events']} in events.jsonl")
    for n in meta.get("notes") or []:
        lines.append(f"  note: {n}")
    return "\n".join(lines) + "\n\n"


def _value(v, unit: str) -> str:
    """A monitor figure with its unit, or "missing" where the GPU did not report it."""
    return "missing" if v is None else f"{v}{unit}"
