"""The instrumentation API: ``annotate``, ``capture``, ``step``, ``record`` and ``profile``.

Each works in three situations: inside a program run by ``proflab run`` (they reach the
runtime in that process), inside a ``proflab.profile()`` block, and on its own, where
``annotate`` still emits NVTX ranges for Nsight tools and the rest do nothing. None of them
imports torch: they use it only when the program has imported it already.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

__all__ = ["annotate", "capture", "step", "record", "profile", "Run"]

_ACTIVE: list[Profile] = []  # proflab.profile() blocks, innermost last
_nvtx_backend: tuple | None = None  # (push, pop) once resolved; () when there is none
_nvtx_missing = False  # the nvtx package was looked for and is not installed


def _runtime():
    """The ``proflab run`` runtime of this process, or None."""
    m = sys.modules.get("_proflab_run")
    return getattr(m, "RUNTIME", None) if m is not None else None


def _nvtx() -> tuple:
    """NVTX push/pop: the ``nvtx`` package when installed, else torch's (with CUDA), else none.
    Resolved once torch is known, so that a program without torch pays one import attempt."""
    global _nvtx_backend, _nvtx_missing
    if _nvtx_backend is not None:
        return _nvtx_backend
    if not _nvtx_missing:
        try:
            import nvtx

            _nvtx_backend = (lambda name, color: nvtx.push_range(name, color=color), nvtx.pop_range)
            return _nvtx_backend
        except ImportError:
            _nvtx_missing = True  # a failed import is not cached by Python: every retry searches the path
    torch = sys.modules.get("torch")
    if torch is None:
        return ()  # not decided yet: torch may come later
    try:
        if torch.cuda.is_available():
            _nvtx_backend = (lambda name, color: torch.cuda.nvtx.range_push(name), torch.cuda.nvtx.range_pop)
        else:
            _nvtx_backend = ()
    except Exception:
        _nvtx_backend = ()
    return _nvtx_backend


_torch = None  # the program's torch, once it is known (_torch_known): read inside compiled code


def _torch_known():
    """The program's torch if it has imported it (never imported here), kept in ``_torch``.
    Called outside compiled code only: Dynamo tracing ``sys.modules`` wraps the whole dict, and
    an import during that raised "dictionary changed size during iteration" (torch 2.13)."""
    global _torch
    if _torch is None:
        _torch = sys.modules.get("torch")
    return _torch


def _compiling() -> bool:
    """Whether torch.compile is tracing this call: an annotation there would break the graph
    (an NVTX push is a call Dynamo cannot trace), so inside compiled code it does nothing; the
    trace names the compiled region itself (``Torch-Compiled Region``). It reads only the torch
    module already kept (``_torch``: known when the program imported torch before proflab, or
    once any annotation ran outside compiled code). A program that imports proflab first and
    whose very first annotation runs inside compiled code has torch looked up there, which
    Dynamo traces: import torch before proflab to be sure of no graph break."""
    torch = _torch
    return bool(torch.compiler.is_compiling()) if torch is not None and hasattr(torch, "compiler") else False


_torch_known()  # (a program that imported torch before proflab: known from the start)


class _Annotation:
    __slots__ = ("name", "color", "_rf", "_pop")

    def __init__(self, name: str, color: str | None = None) -> None:
        self.name = name
        self.color = color
        self._rf = None
        self._pop = None

    def __enter__(self) -> _Annotation:
        if _compiling():
            return self
        nv = _nvtx()
        if nv:
            nv[0](self.name, self.color)
            self._pop = nv[1]
        torch = _torch_known()
        if torch is not None:
            self._rf = torch.profiler.record_function(self.name)
            self._rf.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        rf, self._rf = self._rf, None
        if rf is not None:
            rf.__exit__(*exc)
        pop, self._pop = self._pop, None
        if pop is not None:
            pop()

    def __call__(self, fn: Callable) -> Callable:
        name, color = self.name, self.color

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if _compiling():
                return fn(*args, **kwargs)
            with _Annotation(name, color):
                return fn(*args, **kwargs)

        return wrapper


def annotate(name: str | Callable | None = None, *, color: str | None = None):
    """A named range: an NVTX range (Nsight Systems / Compute) plus a torch.profiler
    ``record_function``. A context manager, or a decorator (``@annotate``, ``@annotate("x")``)
    that names the range after the function by default. Costs next to nothing without torch
    or a GPU."""
    if callable(name):
        fn = name
        return _Annotation(fn.__qualname__, color)(fn)
    if name is None:
        return lambda fn: _Annotation(fn.__qualname__, color)(fn)
    return _Annotation(name, color)


def step() -> None:
    """Mark the end of a training step: advances ``proflab run``'s step window (explicit
    steps then replace the optimizer hook) and the innermost ``proflab.profile()``."""
    rt = _runtime()
    if rt is not None:
        rt.step("user")
    if _ACTIVE:
        _ACTIVE[-1].step()


class capture:
    """A capture range: ``cudaProfilerStart``/``Stop`` (what ``nsys --capture-range
    cudaProfilerApi`` waits for) plus the torch.profiler window of ``proflab run
    --capture-range`` or of ``proflab.profile(window="capture")``."""

    def __enter__(self) -> capture:
        torch = sys.modules.get("torch")
        self._cuda = False
        if torch is not None and torch.cuda.is_available():
            torch.cuda.profiler.start()
            self._cuda = True
        rt = _runtime()
        if rt is not None:
            rt.capture_start()
        if _ACTIVE:
            _ACTIVE[-1].capture_start()
        return self

    def __exit__(self, *exc) -> None:
        if _ACTIVE:
            _ACTIVE[-1].capture_stop()
        rt = _runtime()
        if rt is not None:
            rt.capture_stop()
        if self._cuda:
            import torch

            torch.cuda.synchronize()  # the range must hold the work queued inside it
            torch.cuda.profiler.stop()


_EVENT_KEYS = ("time_ns", "name")


def renamed_fields(fields: dict[str, Any], reserved) -> dict[str, Any]:
    """``fields`` with any key that an event log uses itself renamed ``field_<key>`` (or
    ``field_field_<key>``... when that is taken too): kept, never raising, never overwriting."""
    out = dict(fields)
    for key in [k for k in out if k in reserved]:
        new = f"field_{key}"
        while new in out:
            new = f"field_{new}"
        out[new] = out.pop(key)
    return out


def record(name: str, /, **fields: Any) -> dict[str, Any]:
    """Log one event (``time_ns`` wall clock, ``name``, your fields) into the current run's
    events.jsonl; also a zero-length ``proflab.event:<name>`` range on the trace. ``name`` is
    positional only, so a field may be called ``name`` or ``time_ns`` too: it is kept as
    ``field_name`` / ``field_time_ns``."""
    event = {"time_ns": time.time_ns(), "name": name, **renamed_fields(fields, _EVENT_KEYS)}
    torch = sys.modules.get("torch")
    if torch is not None:
        with torch.profiler.record_function(f"proflab.event:{name}"):
            pass
    rt = _runtime()
    if rt is not None:
        rt.record(event)
    if _ACTIVE:
        _ACTIVE[-1].record(event)
    return event


@dataclass
class Run:
    """What ``proflab.profile()`` produced; filled in when the block ends."""

    path: Path
    traces: list[Path] = field(default_factory=list)
    report: Any = None  # the Report of the first trace (proflab.report/1), or None
    reports: list = field(default_factory=list)
    monitor: Any = None  # MonitorSummary, when a GPU was monitored
    meta: dict = field(default_factory=dict)
    summary: str = ""  # the terminal summary


class Profile:
    """``proflab.profile()``: profile a block of this process into a run directory."""

    def __init__(
        self,
        name: str = "profile",
        *,
        root: str | Path = "proflab-runs",
        wait: int = 0,
        warmup: int = 0,
        active: int | None = None,
        window: str = "block",
        record_shapes: bool = False,
        with_stack: bool = False,
        profile_memory: bool = False,
        monitor: bool | None = None,
        monitor_period_s: float = 0.1,
        analyze: bool = True,
        print_summary: bool = False,
    ) -> None:
        from proflab.errors import UsageError

        if window not in ("block", "capture"):
            raise UsageError(f"window must be 'block' or 'capture', not {window!r}")
        if active is not None and active < 1:
            raise UsageError("active must be >= 1 step")
        self.name, self.root, self.window = name, root, window
        self.wait, self.warmup, self.active = wait, warmup, active
        self.opts = {"record_shapes": record_shapes, "with_stack": with_stack, "profile_memory": profile_memory}
        self.monitor_wanted, self.monitor_period_s = monitor, monitor_period_s
        self.analyze, self.print_summary = analyze, print_summary
        self.run: Run | None = None
        self._prof = None
        self._monitor = None
        self._events = None
        self._t0 = 0.0

    def __enter__(self) -> Run:
        from proflab.collect import launcher, rundir

        path = rundir.new_run_dir(self.root, self.name)
        (path / "traces").mkdir()
        self.run = Run(path=path)
        self._meta = {
            "schema": "proflab.run/1", "name": self.name, "command": list(sys.argv), "cwd": str(Path.cwd()),
            "status": "running", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "exit_status": None,
            "options": {"api": "proflab.profile", "wait": self.wait, "warmup": self.warmup, "active": self.active,
                        "window": self.window, **self.opts},
            "notes": [],
        }  # fmt: skip
        rundir.write_json(path / rundir.META, self._meta)
        self._monitor = launcher._start_monitor(
            launcher.RunOptions(monitor=self.monitor_wanted, monitor_period_s=self.monitor_period_s), self._meta
        )
        try:
            try:
                import torch  # noqa: F401  (proflab.profile records torch; without it, the monitor only)
            except ImportError:
                self._meta["notes"].append("torch is not installed: GPU monitor only, no trace")
            else:
                if self.window == "block":
                    self._start()
        except BaseException as e:
            # __exit__ never runs when __enter__ raises: stop here what was started
            self._abort(e)
            raise
        _ACTIVE.append(self)
        self._t0 = time.perf_counter()
        return self.run

    def _abort(self, e: BaseException) -> None:
        from proflab.collect import rundir

        prof, self._prof = self._prof, None
        if prof is not None:
            try:  # a profiler that failed halfway through start() may be left enabled
                prof.stop()
            except Exception:
                pass  # the error from start() is the one to report
        if self._monitor is not None:
            self._monitor.stop()
        self._meta["status"] = "failed to start"
        self._meta["notes"].append(f"proflab.profile could not start: {type(e).__name__}: {e}")
        rundir.write_json(self.run.path / rundir.META, self._meta)

    def _start(self) -> None:
        import torch

        tp = torch.profiler
        acts = [tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        sched = None
        if self.active is not None:
            sched = tp.schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1)
        self._prof = tp.profile(
            activities=acts, schedule=sched, on_trace_ready=self._export if sched else None, **self.opts
        )
        self._prof.start()

    def _export(self, prof) -> None:
        import os

        import shutil

        out = self.run.path / "traces" / f"{self.name}_{os.getpid()}_{len(self.run.traces)}.pt.trace.json.gz"
        side = self.run.path / "traces" / f".partial-{os.getpid()}"  # this process's own: no other removes it
        side.mkdir(exist_ok=True)
        try:
            prof.export_chrome_trace(str(side / out.name))
            (side / out.name).replace(out)
        finally:
            shutil.rmtree(side, ignore_errors=True)
        self.run.traces.append(out)

    def step(self) -> None:
        if self._prof is not None and self.active is not None:
            self._prof.step()

    def capture_start(self) -> None:
        if self.window == "capture" and self._prof is None and not self.run.traces and "torch" in sys.modules:
            self._start()

    def capture_stop(self) -> None:
        if self.window == "capture" and self._prof is not None:
            self._stop()

    def _stop(self) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        prof.stop()  # a scheduled window in progress is exported by on_trace_ready
        if self.active is None:
            self._export(prof)

    def record(self, event: dict) -> None:
        import json

        if self._events is None:  # appended and flushed per event: survives a crash
            self._events = (self.run.path / "events.jsonl").open("a", encoding="utf-8")
        self._events.write(json.dumps(event, default=str) + "\n")
        self._events.flush()

    def __exit__(self, exc_type, exc, tb) -> None:
        from proflab.collect import launcher

        if self in _ACTIVE:
            _ACTIVE.remove(self)
        try:
            self._stop()
        except Exception as e:
            self._meta["notes"].append(f"stopping torch.profiler failed: {type(e).__name__}: {e}")
        if self._events is not None:
            self._events.close()
        m = self._meta
        m["duration_s"] = round(time.perf_counter() - self._t0, 3)
        m["status"] = "finished" if exc_type is None else f"raised {exc_type.__name__}"
        m["exit_status"] = 0 if exc_type is None else None
        launcher.finalize(self.run.path, m, monitor=self._monitor)
        run = self.run
        run.traces = launcher.trace_files(run.path)
        run.meta = m
        if self._monitor is not None:
            run.monitor = self._monitor.summary()
        if self.analyze and exc_type is None:
            run.summary, run.reports = launcher.analyze_run(run.path, m)
            run.report = run.reports[0] if run.reports else None
            if self.print_summary:
                sys.stdout.write(run.summary)


def profile(name: str = "profile", **kwargs) -> Profile:
    """Profile a block of this process into a run directory; ``with`` gives the :class:`Run`.

    ::

        with proflab.profile("train", wait=2, warmup=1, active=5) as run:
            for batch in data:
                train_step(batch)
                proflab.step()
        print(run.path, run.report.findings)

    Without ``active`` the whole block is recorded; with it, a step window (``wait`` steps
    skipped, ``warmup`` discarded, ``active`` recorded). ``window="capture"`` records only the
    first ``proflab.capture()`` block. The GPU monitor samples alongside when a GPU is
    present (``monitor=False`` turns it off). Keyword arguments: see :class:`Profile`.
    """
    return Profile(name, **kwargs)
