"""The endings matrix of ``proflab run`` (every way a profiled program can end), shared by the
CPU tests (``test_run_endings.py``) and the GPU ones (``tests/gpu/test_run_endings_gpu.py``):
each ending runs a real program under ``proflab run`` in a subprocess, bounded in wall time,
and must return with the program's exit status and a readable trace in its run directory."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import proflab

from scripts import DDP_ENDINGS, ENDINGS, HANG_IN_DESTRUCTOR_C

PROFLAB = [sys.executable, "-m", "proflab", "run", "--no-analyze"]
# The time window opens 0.5 s after the torch import and stays open past every ending.
WINDOW = ["--delay", "0.5", "--duration", "60"]
HUNG = 124


@dataclass(frozen=True)
class Ending:
    status: tuple[int, ...]  # the exit status proflab run must return (any of these)
    args: tuple[str, ...] = ()  # more proflab run options
    send: int | None = None  # a signal sent to proflab once the program says READY
    suffix: str = ""  # the trace's name ends so (the program's own profiler: _own1)
    bound_s: float = 120.0  # proflab run must have returned by then (a busy 2-core machine included)


ENDINGS_MATRIX = {
    "time_window": Ending((0,)),
    "step_window": Ending((0,)),
    "capture": Ending((0,), ("--window", "capture"), suffix="_capture"),
    "own_open": Ending((0,), suffix="_own1"),
    "own_stopped_at_end": Ending((0,), suffix="_own1"),
    "thread_sys_exit": Ending((0,)),
    "exception": Ending((1,)),
    "os_exit": Ending((7,)),
    "sigterm": Ending((128 + signal.SIGTERM,), send=signal.SIGTERM),
    "sigint": Ending((128 + signal.SIGINT,), send=signal.SIGINT),
    "dataloader_fork": Ending((0,)),
    "dataloader_spawn": Ending((0,)),
    "nondaemon_thread": Ending((0,)),
    # hung at exit: proflab ends the program after --exit-timeout (+ its SIGTERM grace)
    "hang_thread": Ending((HUNG,), ("--exit-timeout", "3")),
    "hang_native": Ending((HUNG,), ("--exit-timeout", "3")),
}


@dataclass
class Outcome:
    returncode: int
    wall_s: float
    out: str
    err: str
    run: Path
    meta: dict

    def traces(self) -> list[Path]:
        return [self.run / t for t in self.meta.get("traces") or []]


def _only_run(root: Path) -> Path:
    runs = [p for p in root.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def hang_library(tmp_path: Path) -> Path | None:
    """A shared library whose destructor never returns, or None where no C compiler is."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src, lib = tmp_path / "hang.c", tmp_path / "libhang.so"
    src.write_text(HANG_IN_DESTRUCTOR_C)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True, timeout=60)
    return lib


def run_ending(tmp_path: Path, mode: str, device: str, extra: list[str] | None = None) -> Outcome:
    """``proflab run`` of the ENDINGS program in ``mode``; fails the test if it outlasts its bound."""
    e = ENDINGS_MATRIX[mode]
    prog = tmp_path / "prog.py"
    prog.write_text(ENDINGS)
    argv = [sys.executable, str(prog), mode, device, *(extra or [])]
    return _run(tmp_path, [*WINDOW, *e.args], argv, e.bound_s, e.send)


def run_ddp_ending(tmp_path: Path, mode: str, device: str, bound_s: float = 240.0) -> Outcome:
    prog = tmp_path / "prog.py"
    prog.write_text(DDP_ENDINGS)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(prog), mode, device]
    return _run(tmp_path, WINDOW, argv, bound_s, None)


def _run(tmp_path: Path, options: list[str], argv: list[str], bound_s: float, send: int | None) -> Outcome:
    root = tmp_path / "runs"
    t0 = time.monotonic()
    p = subprocess.Popen(
        [*PROFLAB, "-o", str(root), *options, "--", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        start_new_session=True,  # not the test runner's terminal group: proflab forwards SIGINT
    )  # fmt: skip
    try:
        if send is not None:
            while time.monotonic() - t0 < bound_s:
                line = p.stdout.readline()
                if "READY" in line or not line:
                    break
            p.send_signal(send)
        out, err = p.communicate(timeout=max(1.0, bound_s - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"proflab run did not return within {bound_s:.0f} s\n{err[-3000:]}") from None
    run = _only_run(root)
    return Outcome(p.returncode, time.monotonic() - t0, out, err, run, json.loads((run / "meta.json").read_text()))


def check_ending(o: Outcome, mode: str, *, gpu: bool = False) -> None:
    """What every ending must leave: the status, a readable trace (with GPU work on a GPU),
    and a meta.json that says how the program ended."""
    e = ENDINGS_MATRIX[mode]
    status = e.status
    if gpu and mode == "sigint":
        # torch with CUDA profiling exits 1, not by SIGINT, after an unhandled
        # KeyboardInterrupt stops a profiler at exit (torch's behaviour, H200, torch 2.11)
        status = (*status, 1)
    assert o.returncode in status, (o.returncode, o.err[-3000:])
    assert o.meta["exit_status"] == o.returncode, o.meta
    traces = o.traces()
    assert traces, (o.meta.get("why_no_trace"), o.meta.get("notes"), o.err[-2000:])
    assert any(t.name.endswith(f"{e.suffix}.pt.trace.json.gz") for t in traces), traces
    for t in traces:
        trace = proflab.load(t)
        assert trace.cpu.height > 0
        if gpu:  # the window holds the program's GPU work, not just its start (>= 1 s of small
            # matmuls; the step window: the two steps of 6 the program made after its warm-up)
            assert trace.gpu.height > (20 if mode == "step_window" else 100), (t, trace.gpu.height)
    if e.status == (HUNG,):
        assert o.meta["status"] == "hung at exit", o.meta
        (h,) = o.meta["hung_at_exit"]
        want = "never-ends" if mode == "hang_thread" else "native code after Python's exit handlers"
        assert want in h["waiting_for"], h
        assert "HUNG AT EXIT" in o.out
    else:
        assert o.meta["status"] in ("finished", "interrupted"), o.meta
    # --no-analyze prints where the run went, how it ended, and the step times it has
    assert str(o.run) in o.out and f"exit status {o.returncode}" in o.out, o.out
