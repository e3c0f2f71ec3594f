"""The runtime ``proflab run`` starts inside the profiled process. Standard library only.

``_bootstrap/sitecustomize.py`` loads this file by path (the profiled interpreter need not be
the one proflab is installed in) when ``PROFLAB_RUN_CONFIG`` is set, and registers it as
``sys.modules["_proflab_run"]``, where ``proflab.step()``, ``capture()`` and ``record()`` find it.

torch is never imported here: an import hook waits until the program imports torch itself, so
a program that does not use torch runs unaffected. Once torch is in:

- window ``auto`` (default): a torch.profiler with ``schedule(wait, warmup, active)`` steps on
  every ``proflab.step()`` or, when the program never calls it, on its first optimizer's
  ``step()`` (the global optimizer step hook). If no step comes within ``delay_s`` of the
  torch import (or ``_CUDA_GRACE_S`` after the program's first CUDA work, its CUDA context, where
  that comes sooner: a short inference benchmark), a time window of ``duration_s`` is recorded
  instead (a SIGALRM timer, because
  torch.profiler records the ops of the thread that starts it: the main thread). The timer
  only asks: the profiler starts (or stops) at the first safe point, never while an import
  is in progress (starting torch.profiler imports torch modules; inside a half-run import
  that is a circular ImportError), while torch.compile compiles, inside autograd's backward
  pass, or while a CUDA graph is captured; until then the timer re-arms every ``_RETRY_S``.
  Steps that come later still get their step window: the time window only stood in for them.
- window ``steps``: steps only; ``time``: the time window only; ``capture``: only inside
  ``proflab.capture()`` blocks (the first one); ``cuda-profiler-api`` (``--capture
  cuda-profiler-api``): only inside the program's own first ``cudaProfilerStart``/``Stop`` range,
  as the program calls them from Python (``torch.cuda.profiler.start()``/``stop()`` and
  ``profile()``, ``torch.cuda.cudart().cudaProfilerStart()``: TensorRT-LLM's PyTorch executor
  under ``TLLM_PROFILE_START_STOP``). The CUDA runtime module's two functions are wrapped: the
  program's call runs first and unchanged, and a range opens only where it succeeded (on a build
  without CUDA there is no such call to succeed). The profiler starts on the thread that called
  (an engine's executor thread: the ops it records are that thread's).

A program that runs its own ``torch.profiler.profile`` is followed, not fought: two Kineto
sessions cannot run at once, so proflab's own profiler stands aside (it has recorded nothing
while its schedule waits; a time window in progress is closed and kept), the program's
``prof.step()`` calls count as the run's steps, and every trace the program's profiler
records is also exported into the run directory (``<who>_own<N>``) before the program's own
``on_trace_ready`` handler sees it, so the analysis runs on exactly what the program recorded.

The trace is exported when the window closes (stopped and saved by Kineto on the training
thread, right after the stop: see ``_export`` for why; compressed on a background thread),
and otherwise when the process ends: at exit (normal end, an uncaught exception, Ctrl-C's
KeyboardInterrupt, ``os._exit``) and on SIGTERM, so a crashing or interrupted program still
leaves what was recorded; a profiler of the program's own still open then is stopped and
kept too. Each process writes its own trace (``<host>_<pid>`` or ``rank<R>_<pid>``), so every
torchrun worker leaves one.

One training step outside the profiler's window (the second of the program, where the
schedule still waits; else the first after the window closed) runs under a dispatch mode
that counts FLOPs with ``torch.utils.flop_counter``'s formulas and leaves torch.compile as
it is (``_child_compiled.FlopCount``: the mode FlopCounterMode uses would de-compile a
compiled program for good): its FLOPs by operator, by dtype and by module go into
``processes/<pid>.json`` (``flops``), which the analysis reads for the FLOPs, MFU and
TFLOPS/W of a trace recorded without shapes. That step is slower (every operator passes
through Python once) and is left out of the unprofiled step times. What torch.compile did
(graph breaks, recompiles, CUDA graph skips: Dynamo's own record, only read) goes there
too (``compile``).

The end never hangs on Kineto's CUPTI teardown (``end_without_teardown``), and each process
writes ``processes/<pid>.exit`` as it ends (its main thread done, the threads it waits for,
proflab's exit handler started and done): the launcher reads it to tell a process that hung
at exit from one that still works.
"""

from __future__ import annotations

import atexit
import gzip
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time

CONFIG_ENV = "PROFLAB_RUN_CONFIG"

_TORCH_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch", "torchrun")
_RETRY_S = 0.1  # how soon a time window that met no safe point asks again
# window auto without steps: the time window starts this long after the program's first CUDA work
# (its CUDA context), unless a step comes first, rather than delay_s after the torch import: a
# 3 s inference benchmark then leaves a trace. The wait lets a training loop that steps soon after
# its context exists claim its step window first, as it did before (no startup trace for it).
_CUDA_GRACE_S = 1.0
_STEP_TIMES = 20_000  # step intervals kept for the unprofiled step time
_STEP_WARMUP = 3  # the program's first steps (compilation, allocator warm-up) are not timed
_STEP_LIST = 2_000  # step times kept in processes/<pid>.json per label
MIN_BARE_STEPS = 3  # fewer bare step intervals are not a measurement of the loop's step time
_GPU_PENDING = 4_096  # step intervals the GPU may be behind by before GPU-side timing gives up
_GPU_POLL_EVERY = 32  # marks between reads of the completed intervals (a read costs a few us)
_GPU_DRAIN_S = 1.0  # the longest the end waits for the GPU to reach the last step's event
_JOIN_S = 300.0  # the longest the program waits for a trace's compression (at exit, say)
_SETTLE_CALLS, _SETTLE_EVERY_S = 15, 0.01  # CUDA calls that let Kineto's teardown run (see settle_cupti_teardown)
_SETTLE_WAIT_S = 2.0  # the longest a new session waits for them
_SETTLE_AT_EXIT_S = 5.0  # a stop this recent gets its teardown calls made at exit, on the exiting thread
EXIT_MARK = ".exit"  # processes/<pid>.exit: how far the process got in ending (the launcher's watchdog)
_IMPORTLIB_FILES = ("importlib._bootstrap", "importlib/_bootstrap.py", "importlib/_bootstrap_external.py")
_COMPILING_FILES = ("torch/_dynamo/convert_frame.py", "torch/_inductor/compile_fx.py")


def settle_cupti_teardown(torch) -> threading.Thread | None:
    """Let Kineto finish tearing CUPTI down after a profiler stopped, whatever the program
    does next; returns the thread doing it (join it before the next session starts).

    With ``TEARDOWN_CUPTI=1`` Kineto's stop hands the teardown to a thread of its own, which
    arms a callback: CUPTI is finalised in the exit of the *next* CUDA runtime call of the
    process. A session started before any such call (a time window over a start-up that
    launches nothing, then the step window or the program's own profiler) races it, and the
    teardown is lost: kernel tracing stays on for the rest of the process. On an H100
    (PyTorch 2.11, CUDA 13) one tiny kernel replayed from a CUDA graph then took 1.22-1.51 us
    of GPU time for good instead of 1.00; separated by unprofiled steps, or by a few CUDA
    calls, the two sessions left 1.00-1.01 (benchmarks/probe_profiler_residue.py).

    So a few calls are made from a thread of our own, off the training thread, spread over
    ``_SETTLE_CALLS * _SETTLE_EVERY_S`` seconds. The call must be harmless anywhere:
    ``cudaGetDevice`` (``torch.cuda.current_device()``) launches nothing, waits for nothing
    and is allowed while another thread captures a CUDA graph (a stream query there
    invalidated a capture made as the window closed: tests/gpu/test_run_live.py)."""
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None  # no CUDA context: CUPTI has nothing to trace
    except Exception:
        return None

    def calls() -> None:
        try:
            for _ in range(_SETTLE_CALLS):
                torch.cuda.current_device()  # cudaGetDevice
                time.sleep(_SETTLE_EVERY_S)
        except Exception:  # a failing CUDA call here is the program's to meet, not ours
            pass

    t = threading.Thread(target=calls, name="proflab-cupti-teardown", daemon=True)
    t.start()
    return t


def end_without_teardown() -> None:
    """Stop torch.profiler sessions at the end of the process without Kineto's CUPTI teardown.

    With ``TEARDOWN_CUPTI=1`` (what ``proflab run`` sets) a session's stop starts a detached
    thread that waits on a condition variable for the next CUDA call, which finalises CUPTI.
    A process that makes no CUDA call after the stop never wakes it, and at exit glibc's
    ``pthread_cond_destroy`` in a static destructor waits for that waiter for ever: on an
    H200 (PyTorch 2.11, CUDA 13) every GPU program stopped that way hung at exit, the main
    thread in ``exit -> pthread_cond_destroy``, Kineto's thread in ``teardownContext``'s
    wait; plain torch.profiler with the same setting hung too, and returned with
    ``TEARDOWN_CUPTI=0`` or a few CUDA calls after the stop (benchmarks/probe_exit_hang.py).
    Kineto reads the variable at each stop, and a teardown buys nothing in a process that is
    ending, so the stops made at the end run without it."""
    os.environ["TEARDOWN_CUPTI"] = "0"


def apply_knobs(torch, knobs: dict, notes: list) -> None:
    """Set ``proflab try``'s knobs (``collect/knobs.py`` names them) in this process, torch just
    imported: torch's own settings now, and the defaults of the DataLoader, optimizer and DDP
    constructors the program calls later. A knob that fails is a note, never the program's end."""

    def wrap(cls, change) -> None:
        init = cls.__init__
        if getattr(init, "_proflab_knobs", False):
            return

        def __init__(self, *args, **kwargs):
            change(kwargs)
            init(self, *args, **kwargs)

        __init__._proflab_knobs = True
        __init__.__wrapped__ = init
        cls.__init__ = __init__

    try:
        if "tf32" in knobs:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.set_float32_matmul_precision("high")
        if "matmul-precision" in knobs:
            torch.set_float32_matmul_precision(knobs["matmul-precision"])
        if "cudnn-benchmark" in knobs:
            torch.backends.cudnn.benchmark = True
        loader = {k: v for k, v in knobs.items() if k in ("workers", "pin-memory", "persistent-workers", "prefetch")}
        if loader:
            def data(kw):
                if "workers" in loader:
                    kw["num_workers"] = int(loader["workers"])
                if "pin-memory" in loader:
                    kw["pin_memory"] = True
                workers = kw.get("num_workers", 0) > 0
                if "persistent-workers" in loader and workers:
                    kw["persistent_workers"] = True
                if "prefetch" in loader and workers:
                    kw["prefetch_factor"] = int(loader["prefetch"])

            wrap(torch.utils.data.DataLoader, data)
        for knob, arg, other in (("foreach-optimizer", "foreach", "fused"), ("fused-optimizer", "fused", "foreach")):
            if knob in knobs:
                import inspect

                for name in ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam", "ASGD", "Adadelta"):
                    cls = getattr(torch.optim, name, None)
                    if cls is None or arg not in inspect.signature(cls.__init__).parameters:
                        continue

                    def opt(kw, arg=arg, other=other):
                        kw[arg] = True
                        kw.pop(other, None)

                    wrap(cls, opt)
        if "compile-mode" in knobs:
            compile_, mode = torch.compile, knobs["compile-mode"]
            if not getattr(compile_, "_proflab_knobs", False):
                def compile(*args, **kwargs):
                    if kwargs.pop("options", None) is not None:  # (torch takes a mode or options, not both)
                        notes.append(f"proflab try: compile-mode={mode} replaced a torch.compile's options")
                    kwargs["mode"] = mode
                    return compile_(*args, **kwargs)

                compile._proflab_knobs = True
                compile.__wrapped__ = compile_
                torch.compile = compile
        ddp = {k: v for k, v in knobs.items() if k.startswith("ddp-")}
        if ddp:
            from torch.nn.parallel import DistributedDataParallel as DDP

            def bucket(kw):
                if "ddp-bucket-mb" in ddp:
                    kw["bucket_cap_mb"] = float(ddp["ddp-bucket-mb"])
                if "ddp-grad-view" in ddp:
                    kw["gradient_as_bucket_view"] = True

            wrap(DDP, bucket)
            if "ddp-bf16-hook" in ddp:
                init = DDP.__init__

                def __init__(self, *args, **kwargs):
                    init(self, *args, **kwargs)
                    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                    self.register_comm_hook(None, default_hooks.bf16_compress_hook)

                __init__._proflab_knobs = True
                DDP.__init__ = __init__
        notes.append("proflab try set: " + ", ".join(k if v is None else f"{k}={v}" for k, v in knobs.items()))
    except Exception as e:
        notes.append(f"proflab try could not set its knobs: {type(e).__name__}: {e}")


def _step_medians(times: list[tuple[float, bool, int]], window_end_steps: list[int]) -> dict:
    """Bare and profiled medians (ms) of (ms, bare, step) intervals, the program's first
    _STEP_WARMUP steps and the steps that held a window's end left out; the last _STEP_LIST
    of each, in order, for distributions (proflab compare's interval)."""
    ended = set(window_end_steps)
    keep = [(d, bare) for d, bare, k in times if k > _STEP_WARMUP and k not in ended]
    out: dict = {}
    for label, want in (("bare", True), ("profiled", False)):
        xs = [d for d, bare in keep if bare == want]
        mid = sorted(xs)
        out[f"{label}_n"] = len(xs)
        out[f"{label}_ms"] = round(mid[len(mid) // 2], 4) if xs else None
        out[f"{label}_steps_ms"] = [round(d, 4) for d in xs[-_STEP_LIST:]]
    return out


class GpuStepClock:
    """GPU-side step intervals: a CUDA event recorded on the current stream at every step's
    end (the optimizer hook or ``proflab.step()``, on the training thread), read once both of
    an interval's events have completed.

    The host's step-to-step time is the loop's pace only once the launch queue is full: a
    loop whose host enqueues a step faster than its GPU runs it gains a little every step,
    and over a few dozen steps the host's intervals stay shorter than the GPU's (the 4-GPU
    balanced DDP loop: 2.4-3.0 ms on the host, 3.45 ms on the GPU, tests/data/kineto/scaling).
    The events give the step the GPU experiences whichever side is behind.

    A record costs a few microseconds and never waits; every _GPU_POLL_EVERY marks the
    completed intervals are read (a query, never a wait) while the program runs, and
    ``drain`` waits a bounded time for the last ones at the end. No event is recorded while
    the current stream captures a CUDA graph: the chain of intervals restarts after it."""

    def __init__(self, cuda, poll_every: int = _GPU_POLL_EVERY) -> None:
        self._cuda = cuda
        self._torch_c = sys.modules["torch"]._C
        self._streams: dict = {}
        self._poll_every = poll_every
        self._marks = 0
        self._free: list = []
        self._last = None  # the previous step's event
        self._pending: list = []  # (start, end, bare, step), oldest first
        self._head = 0  # intervals before it are read
        self.times: list[tuple[float, bool, int]] = []  # (ms, bare, step)
        self.failed: str | None = None

    def mark(self, bare: bool, step: int) -> None:
        """Step ``step`` ended; the interval since the previous mark is ``bare`` or not."""
        if self.failed is not None:
            return
        try:
            if self._cuda.is_current_stream_capturing():
                self._last = None
                return
            ev = self._free.pop() if self._free else self._cuda.Event(enable_timing=True)
            ev.record(self._current_stream())
            if self._last is not None:
                self._pending.append((self._last, ev, bare, step))
            self._last = ev
            self._marks += 1
            if self._marks % self._poll_every == 0:
                self.poll()
        except Exception as e:  # timing is ours to lose, never the program's
            self._give_up(e)

    def _current_stream(self):
        """The current stream, its Python object made once per stream: ``torch.cuda.
        current_stream()`` builds a new one each call, 5 of the 8.7 us a record took on an
        H200 (benchmarks/bench_step_clock.py)."""
        get = getattr(self._torch_c, "_cuda_getCurrentStream", None)
        if get is None:
            return self._cuda.current_stream()
        sid, dev, kind = get(-1)  # -1: the current device
        stream = self._streams.get((sid, dev, kind))
        if stream is None:
            stream = self._streams[sid, dev, kind] = self._cuda.Stream(stream_id=sid, device_index=dev, device_type=kind)
        return stream

    def poll(self) -> None:
        """Read every interval whose end has completed, oldest first; never waits."""
        pending, i = self._pending, self._head
        while i < len(pending) and pending[i][1].query():
            start, end, bare, step = pending[i]
            self.times.append((start.elapsed_time(end), bare, step))
            self._free.append(start)  # the end of an interval read before: no longer needed
            i += 1
        if i > 256 and i * 2 > len(pending):
            del pending[:i]
            i = 0
        self._head = i
        if len(pending) - i > _GPU_PENDING:
            self._give_up(None)
        if len(self.times) > _STEP_TIMES:
            del self.times[: len(self.times) - _STEP_TIMES]

    def drain(self, timeout_s: float = _GPU_DRAIN_S) -> None:
        """Read what the GPU finishes within ``timeout_s`` (at the end: the last steps' events)."""
        deadline = time.perf_counter() + timeout_s
        try:
            while self.failed is None:
                self.poll()
                if self._head >= len(self._pending) or time.perf_counter() > deadline:
                    return
                time.sleep(0.001)
        except Exception as e:
            self._give_up(e)

    def _give_up(self, e: Exception | None) -> None:
        self.failed = (f"{type(e).__name__}: {e}" if e is not None
                       else f"the GPU was more than {_GPU_PENDING} steps behind the host")  # fmt: skip
        self._pending, self._head, self._last, self._free = [], 0, None, []


def _sibling(name: str):
    """A standard-library module beside this file, loaded by path as this one is (the
    profiled interpreter need not have proflab installed)."""
    key = f"_proflab_run_{name}"
    if key not in sys.modules:
        import importlib.util

        spec = importlib.util.spec_from_file_location(key, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


class _Sections:
    """The runtime's lock (reentrant), which also knows when the main thread is inside one of
    proflab's own sections: starting or stopping torch.profiler, saving a trace, ending. Signal
    handlers run on the main thread between two of its bytecodes, so they may land in the middle
    of such a section. The SIGALRM handler then tries again later; a SIGTERM is acted on as the
    main thread leaves its outermost section (``defer``), so a profiler is never stopped half
    started (torch.profiler's "Profiler must be initialized before stopping trace", when torchrun
    ends a rank while its window opens) nor a trace cut off as it is written."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.depth = 0  # sections entered and not yet left, by whichever thread holds the lock
        self.main_depth = 0  # those of the main thread
        self._deferred = None  # what to do once the main thread is out of them

    def __enter__(self) -> _Sections:
        self._lock.acquire()
        self.depth += 1
        if threading.current_thread() is threading.main_thread():
            self.main_depth += 1
        return self

    def __exit__(self, *exc) -> None:
        main = threading.current_thread() is threading.main_thread()
        if main:
            self.main_depth -= 1
        self.depth -= 1
        self._lock.release()
        if main and self.main_depth == 0 and self._deferred is not None:
            act, self._deferred = self._deferred, None
            act()

    def defer(self, act) -> bool:
        """Called on the main thread (a signal handler): put ``act`` off to the end of the
        section it interrupted, if any (True), else leave it to the caller (False)."""
        if self.main_depth == 0:
            return False
        self._deferred = act
        return True


class Runtime:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.run_dir = cfg["run_dir"]
        self.window = cfg.get("window", "auto")
        self.pid = os.getpid()
        self.started_ns = time.time_ns()
        self.torch = None
        self.prof = None  # the active torch.profiler.profile
        self.prof_kind = None  # "steps" | "time" | "capture"
        self.steps = 0
        self.step_source = None  # "user" (proflab.step) | "profiler" (the program's prof.step) | "optimizer"
        self._optimizer_id = None
        self.traces: list[str] = []
        self.startup_traces: list[str] = []  # time-window fallbacks that steps replaced (traces/startup/)
        self.notes: list[str] = []
        self.done = False  # the window closed (or proflab stood aside): record nothing more
        self._finished = False
        self._lock = _Sections()
        self._step_times: list[tuple[int, bool, int]] = []  # (interval ns, bare, step number)
        self._gpu_clock: GpuStepClock | None = None  # GPU-side intervals, once CUDA is in use
        self._no_gpu_clock = False  # asking torch about CUDA failed: the host's clock only
        self._last_step_ns: int | None = None
        self._last_step_profiling = False
        self._window_end_steps: list[int] = []
        self._flop_count = None  # the step being counted (_child_compiled.FlopCount)
        self._flops: dict | None = None  # its record, or why there is none (processes/<pid>.json: flops)
        self._flop_steps: list[int] = []  # the counted step's interval: not a bare step time
        # What the compression thread touches (the trace list, notes, the process file) is
        # guarded by this lock, never by _lock: the training thread joins that thread while
        # holding _lock (at exit, when steps replace the fallback window).
        self._info_lock = threading.RLock()  # reentrant: the SIGALRM handler may interrupt a holder
        self._events = None
        self._captures = 0
        self._alarm_phase = None  # "start" | "stop"
        self._provisional = False  # a time-window fallback is in progress or done, no step yet
        self._step_base = 0
        self._own_traces = 0  # traces exported from the program's own profiler
        self._deferred_s = 0.0  # time the time window waited for a safe point
        self._deferred_why: list[str] = []  # each reason the time window waited, first seen first
        self._deferred_since: float | None = None
        self._armed_at: float | None = None  # when the time window's timer was armed (auto: polls CUDA)
        self._cuda_since: float | None = None  # when the poll first saw the program's CUDA context
        self._outer_import_frames: list = []  # imports that enclose the program's `import torch`
        self._outer_importing: set[str] = set()
        self._exports: list[threading.Thread] = []
        self._settling: threading.Thread | None = None  # settle_cupti_teardown's calls after our last stop
        self._teardown_stop_at: float | None = None  # the last stop made with Kineto's CUPTI teardown on
        self._program_profs: list = []  # the program's own torch.profiler sessions, started and not stopped
        self._exit_marks: dict = {}  # what processes/<pid>.exit says so far
        self.failure: str | None = None  # why proflab stopped recording, when it failed
        self.last_save_s: float | None = None  # Kineto's save of the last trace, on the training thread
        argv = getattr(sys, "orig_argv", sys.argv)
        # torchrun's launcher, and torch.compile's compile workers (subprocesses that import
        # torch, never step, and would each record a time window of their own)
        self._launcher = any(x.endswith(_TORCH_LAUNCHERS) or "compile_worker" in x for x in argv[:3])
        self._mp_child = "--multiprocessing-fork" in argv

    # -- setup -----------------------------------------------------------------------------

    @property
    def profiles(self) -> bool:
        """Whether this process records a torch trace (launchers and worker processes do not)."""
        return self.cfg.get("backend", "torch") == "torch" and not self._launcher and not self._mp_child

    def install(self) -> None:
        atexit.register(self.finish)
        # Runs as the main thread ends, before the interpreter waits for non-daemon threads
        # (atexit handlers run after that wait): the start of the launcher's exit clock.
        register = getattr(threading, "_register_atexit", None)
        if register is not None:
            try:
                register(self._main_thread_done)
            except RuntimeError:  # the interpreter is already shutting down
                pass
        self._wrap_os_exit()
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        if "torch" in sys.modules:  # imported by another sitecustomize before us
            self.on_torch(sys.modules["torch"])
        else:
            sys.meta_path.insert(0, _TorchImportHook(self))

    def _wrap_os_exit(self) -> None:
        """``os._exit`` skips atexit: run ``finish`` first, so a program that leaves that way
        keeps its window too. Forked children (multiprocessing's, which always leave through
        ``os._exit``) pass straight through: ``finish`` declines in them."""
        real = os._exit
        if getattr(real, "_proflab_wrapped", False):
            return
        runtime = self

        def _exit(status):
            if os.getpid() == runtime.pid:
                try:
                    runtime.finish()
                except BaseException:  # the program asked to leave now: leave whatever happens
                    pass
            real(status)

        _exit._proflab_wrapped = True
        _exit.__wrapped__ = real
        _exit.__doc__ = real.__doc__
        os._exit = _exit

    def _main_thread_done(self) -> None:
        if os.getpid() != self.pid:
            return
        me = threading.current_thread()
        waiting = [t.name for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive()]
        self._mark_exit(main_finished_s=time.time(), waiting_for_threads=waiting)

    def _mark_exit(self, **fields) -> None:
        """Update processes/<pid>.exit (atomically): how far this process got in ending."""
        self._exit_marks.update(fields)
        d = os.path.join(self.run_dir, "processes")
        try:
            os.makedirs(d, exist_ok=True)
            tmp = os.path.join(d, f".{self.pid}{EXIT_MARK}.tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"pid": self.pid, "rank": os.environ.get("RANK"), **self._exit_marks}, f)
            os.replace(tmp, os.path.join(d, f"{self.pid}{EXIT_MARK}"))
        except OSError:
            pass  # the run directory went away; nothing to tell

    def _on_sigterm(self, signum, frame) -> None:
        # Forked children (DataLoader workers, multiprocessing pools, whose terminate() sends
        # SIGTERM) inherit this handler: finish() declines there, so they just end (and never
        # wait for a section: a fork copies the count of one it can never leave).
        if os.getpid() == self.pid and self._lock.defer(self._end_by_sigterm):
            return  # proflab is mid-way through its own section here: it ends there first
        self._end_by_sigterm()

    def _end_by_sigterm(self) -> None:
        self.finish()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def on_torch(self, torch) -> None:
        """torch has just finished importing in this process."""
        self.torch = torch
        self._write_process_info()
        if not self.profiles:
            return
        try:
            self._note_outer_imports()
        except Exception:
            pass
        try:
            self._follow_program_profilers(torch)
        except Exception as e:
            self.notes.append(f"proflab cannot follow the program's own torch.profiler: {type(e).__name__}: {e}")
        if self.cfg.get("knobs"):
            apply_knobs(torch, self.cfg["knobs"], self.notes)
        if self.window == "none":  # proflab try: no profiler, the steps timed only
            self._hook_optimizer_steps()
            return
        if self.window == "cuda-profiler-api":
            try:
                self._hook_cuda_profiler_api(torch)
            except Exception as e:
                self.notes.append(f"proflab cannot follow cudaProfilerStart/Stop: {type(e).__name__}: {e}")
            return
        try:
            if self.cfg.get("memory_snapshot") and torch.cuda.is_available():
                torch.cuda.memory._record_memory_history(max_entries=int(self.cfg.get("snapshot_entries", 100000)))
            if self.window in ("auto", "steps"):
                self._start_steps()
            if self.window == "time" or (self.window == "auto" and self.cfg.get("delay_s") is not None):
                self._arm_time_window()
        except Exception as e:  # never break the program: say why there is no trace
            self.notes.append(f"proflab could not start torch.profiler: {type(e).__name__}: {e}")
            self.done = True

    # -- safe points -----------------------------------------------------------------------

    def _note_outer_imports(self) -> None:
        """Remember the imports under way when torch finished importing: the program's own
        (``import transformers`` imports torch; a program may even train inside an import).
        They never end while the program runs, so they cannot count against a safe point;
        any import that starts after this one does."""
        f = sys._getframe()
        while f is not None:
            if any(m in f.f_code.co_filename for m in _IMPORTLIB_FILES):
                self._outer_import_frames.append(f)  # kept alive, so their ids stay theirs
            f = f.f_back
        self._outer_importing = _initializing_modules()

    def _not_a_safe_point(self) -> str | None:
        """Why torch.profiler must not start or stop right now (None: it may). Called from
        the SIGALRM handler, which interrupts the main thread anywhere."""
        if self._lock.depth:
            return "proflab itself was busy"
        outer = {id(f) for f in self._outer_import_frames}
        main = threading.main_thread().ident
        for tid, top in sys._current_frames().items():
            f = top
            while f is not None:
                name = f.f_code.co_filename
                if any(m in name for m in _IMPORTLIB_FILES) and id(f) not in outer:
                    return "an import was in progress" + ("" if tid == main else " on another thread")
                if tid == main and name.endswith(_COMPILING_FILES):
                    return "torch.compile was compiling"
                f = f.f_back
        if _initializing_modules() - self._outer_importing:
            return "an import was in progress"
        # Autograd's engine runs a backward pass (on the CPU: on this thread) under a guard
        # that restores the thread-local state afterwards: a profiler started in there loses
        # its state when the pass ends, and stopping it later crashed the program (SIGSEGV,
        # torch.compile on the CPU, whose compiled backward runs Python code in the pass).
        graph_task = getattr(getattr(self.torch, "_C", None), "_current_graph_task_id", None)
        if graph_task is not None and graph_task() != -1:
            return "autograd's backward pass was running"
        cuda = getattr(self.torch, "cuda", None)
        if cuda is not None and cuda.is_initialized() and cuda.is_current_stream_capturing():
            return "a CUDA graph was being captured"
        return None

    # -- torch.profiler --------------------------------------------------------------------

    def _profiler(self, schedule=None):
        tp = self.torch.profiler
        acts = [tp.ProfilerActivity.CPU]
        if self.torch.cuda.is_available():
            acts.append(tp.ProfilerActivity.CUDA)
        prof = tp.profile(
            activities=acts,
            schedule=schedule,
            on_trace_ready=self._on_trace_ready if schedule is not None else None,
            record_shapes=bool(self.cfg.get("record_shapes", True)),
            with_stack=bool(self.cfg.get("with_stack", False)),
            profile_memory=bool(self.cfg.get("profile_memory", False)),
        )
        prof._proflab_own = True
        return prof

    # -- the program's own torch.profiler ----------------------------------------------------

    def _follow_program_profilers(self, torch) -> None:
        """Wrap torch.profiler.profile's start/step/stop (see the module docstring)."""
        cls = torch.profiler.profile
        if getattr(cls, "_proflab_followed", False):
            return
        runtime = self
        start, step, stop = cls.start, cls.step, cls.stop

        def quietly(what, *args) -> None:  # proflab's part must never break the program's profiler
            try:
                what(*args)
            except Exception as e:
                runtime.notes.append(f"following the program's torch.profiler failed: {type(e).__name__}: {e}")

        def start_(prof):
            if not getattr(prof, "_proflab_own", False):
                quietly(runtime._program_profiler_starts, prof)
            out = start(prof)
            if not getattr(prof, "_proflab_own", False):
                runtime._program_profs.append(prof)
            return out

        def step_(prof):
            out = step(prof)
            if not getattr(prof, "_proflab_own", False):
                quietly(runtime.step, "profiler")
            return out

        def stop_(prof):
            own = getattr(prof, "_proflab_own", False)
            if not own:
                runtime._program_profs[:] = [p for p in runtime._program_profs if p is not prof]
            out = stop(prof)
            if not own:
                if getattr(prof, "_proflab_on_ready", None) is None:
                    quietly(runtime._keep_program_trace, prof)  # no handler: what it recorded ends at stop
                quietly(runtime._settle)  # its teardown, as after our own stops (see end_without_teardown)
            return out

        cls.start, cls.step, cls.stop = start_, step_, stop_
        cls._proflab_followed = True

    def _program_profiler_starts(self, prof) -> None:
        with self._lock:
            if self.prof is not None:
                try:
                    if self.prof_kind in ("time", "capture"):
                        self.notes.append("the program started its own torch.profiler: proflab's window was closed there")
                        self._stop_and_export()
                    else:  # the step schedule, still waiting: nothing recorded yet
                        warming = self._profiling_now()  # past its wait steps: a Kineto session is open
                        self.prof.stop()
                        if warming:
                            self._settle()
                except Exception as e:
                    self.notes.append(f"stopping proflab's torch.profiler failed: {type(e).__name__}: {e}")
                self.prof, self.prof_kind = None, None
            self._wait_settled()  # the program's session starts next: our teardown first
            if self._alarm_phase is not None and threading.current_thread() is threading.main_thread():
                signal.setitimer(signal.ITIMER_REAL, 0)
                self._alarm_phase = None
            self.done = True
            note = "the program runs its own torch.profiler: proflab keeps a copy of each trace it records"
            if note not in self.notes:
                self.notes.append(note)
        handler = getattr(prof, "on_trace_ready", None)
        if handler is not None and getattr(prof, "_proflab_on_ready", None) is None:

            def on_ready(p, _handler=handler):
                try:
                    self._keep_program_trace(p)
                except Exception as e:  # the program's own handler runs whatever happens here
                    self.notes.append(f"copying the program's trace failed: {type(e).__name__}: {e}")
                return _handler(p)

            prof._proflab_on_ready = on_ready
            prof.on_trace_ready = on_ready

    def _keep_program_trace(self, prof) -> None:
        if not self.profiles:
            return
        with self._lock:
            try:
                if getattr(prof, "profiler", None) is None or getattr(prof.profiler, "kineto_results", None) is None:
                    return  # stopped before anything was recorded
            except Exception:
                return
            self._own_traces += 1
            before = len(self.traces)
            self._export(prof, f"_own{self._own_traces}")
            if len(self.traces) > before:
                _serve_later_exports(prof.profiler, self.traces[-1])

    def _settle(self) -> None:
        """A session stopped: let Kineto's CUPTI teardown run now (see
        settle_cupti_teardown). Not at exit: the process ends, and a daemon thread inside a
        CUDA call while CUDA unloads is a crash waiting to happen (``_settle_at_exit`` makes
        the calls there, on the exiting thread)."""
        if os.environ.get("TEARDOWN_CUPTI") == "1":
            self._teardown_stop_at = time.perf_counter()
        if self._finished or self.torch is None:
            return
        self._wait_settled()
        try:
            self._settling = settle_cupti_teardown(self.torch)
        except Exception:
            self._settling = None

    def _settle_at_exit(self) -> None:
        """A stop made shortly before the end may have left Kineto's teardown thread waiting
        for a CUDA call (the settle thread's calls cut short by the exit, or made before the
        teardown was armed): make them here, on the exiting thread, while CUDA is still up;
        otherwise the process hangs in its static destructors (see end_without_teardown)."""
        at = self._teardown_stop_at
        if at is None or self.torch is None:
            return
        self._wait_settled()
        if time.perf_counter() - at > _SETTLE_AT_EXIT_S:
            return  # the program's own CUDA calls since then ran the teardown
        try:
            if not self.torch.cuda.is_initialized():
                return
            for _ in range(_SETTLE_CALLS):
                self.torch.cuda.current_device()  # cudaGetDevice: launches nothing, waits for nothing
                time.sleep(_SETTLE_EVERY_S)
        except Exception:
            pass

    def _stop_program_profilers(self) -> None:
        """The program's own torch.profiler still records as the process ends (never
        stopped, or a ``with`` block left by ``os._exit``): stop it, which keeps its trace as
        any stop does. Left running, Kineto's session crashed the process at exit (SIGSEGV,
        PyTorch 2.11 on an H200, benchmarks/probe_exit_hang.py)."""
        for prof in list(self._program_profs):
            try:
                prof.stop()
                self.notes.append("the program's own torch.profiler was still recording as it ended: proflab stopped it and kept its trace")
            except Exception as e:
                self.notes.append(f"stopping the program's own torch.profiler at exit failed: {type(e).__name__}: {e}")
        self._program_profs = []

    def _wait_settled(self) -> None:
        """A session is about to start: the last one's teardown must be over first."""
        t, self._settling = self._settling, None
        if t is not None and t is not threading.current_thread():
            t.join(_SETTLE_WAIT_S)

    def _someone_else_profiles(self) -> bool:
        try:
            return bool(self.torch.autograd.profiler._is_profiler_enabled)
        except Exception:
            return False

    def _start_steps(self, hook: bool = True) -> None:
        c = self.cfg
        sched = self.torch.profiler.schedule(
            wait=int(c.get("wait", 3)), warmup=int(c.get("warmup", 1)), active=int(c.get("active", 5)), repeat=1
        )
        self.prof = self._profiler(sched)
        if int(c.get("wait", 3)) == 0:  # warm-up (a Kineto session) begins in start()
            self._wait_settled()
        self.prof.start()  # in the wait phase: nothing is recorded until warm-up
        self.prof_kind = "steps"
        if hook:
            self._hook_optimizer_steps()

    def _hook_optimizer_steps(self) -> None:
        if not self.cfg.get("optimizer_steps", True):
            return
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            register_optimizer_step_post_hook(self._on_optimizer_step)
        except ImportError:  # torch < 2.0 has no global hook
            self.notes.append("this torch has no global optimizer step hook; call proflab.step() each step")

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if self.step_source in ("user", "profiler"):
            return  # explicit steps win
        # With several optimizers (GANs, per-module optimizers) one iteration steps each of
        # them: count the steps of the first one seen only.
        if self._optimizer_id is None:
            self._optimizer_id = id(optimizer)
        elif id(optimizer) != self._optimizer_id:
            return
        self.step("optimizer")

    def step(self, source: str = "user") -> None:
        """One training step ended (``proflab.step()``, or the optimizer hook)."""
        with self._lock:
            rank = ("optimizer", "profiler", "user")  # a more explicit source takes over
            if self.step_source is not None and rank.index(source) < rank.index(self.step_source):
                return  # the same step, seen again through a less explicit source
            if self.step_source is not None and rank.index(source) > rank.index(self.step_source):
                self.step_source = source  # the step the old source just counted ends here: not a new one
                return
            self.step_source = source
            self.steps += 1
            self._time_step()
            try:
                if self.window == "auto" and self._provisional:
                    self._back_to_steps()
                if self.prof is None or self.prof_kind != "steps" or self.done:
                    self._count_flops()
                    return
                if self.steps - self._step_base == int(self.cfg.get("wait", 3)):  # this step starts warm-up
                    if self._someone_else_profiles():
                        self._stand_aside()
                        return
                    self._wait_settled()
                t0 = time.perf_counter()
                self.prof.step()
                if self.done:  # this step closed the window: what did the program wait for?
                    self._window_end_steps.append(self.steps + 1)  # the interval ending next holds the save
                    self._note_stall(time.perf_counter() - t0)
                self._count_flops()
            except Exception as e:
                self._fail("torch.profiler step failed", e)

    def _count_flops(self) -> None:
        """At a step's end: finish the counted step, or start counting the next one where it
        is outside every profiler's recording (see the module doc). Counting is proflab's
        to lose, never the program's: a failure is recorded and counting ends."""
        if self._flops is not None or not self.cfg.get("count_flops", True) or self.torch is None or self.window == "none":
            return  # (window none: proflab try's runs are timed, every step bare)
        try:
            if self._flop_count is not None:
                count, self._flop_count = self._flop_count, None
                self._flops = count.stop(self.torch, self.steps)
                if not self._flops["total"]:
                    self._flops = {"missing": "the counted step ran no operator with a FLOP formula (a CUDA graph "
                                              "replay, a compiled step, or no matrix products)", "step": self.steps}
                self._write_process_info()
                return
            k = self.steps - self._step_base
            waiting = self.prof_kind == "steps" and not self.done and 1 <= k < int(self.cfg.get("wait", 3))
            closed = self.done or self.prof is None
            if not (waiting or closed) or self._profiling_now() or self._someone_else_profiles():
                return
            counting = _sibling("_child_compiled")
            try:
                self._flop_count = counting.FlopCount(self.torch)
            except counting.CannotCount as e:
                self._flops = {"missing": str(e)}
                return
            self._flop_steps.append(self.steps + 1)  # the interval ending at the next step
        except Exception as e:
            if self._flop_count is not None:
                self._flop_count.abandon()
                self._flop_count = None
            self._flops = {"missing": f"counting one step's FLOPs failed: {type(e).__name__}: {e}"}

    def _profiling_now(self) -> bool:
        """Whether a profiler records (adds its cost) right now: a time window, or a step
        window past its wait steps (a schedule waiting records nothing)."""
        prof = self.prof
        if prof is None or self.done:
            return self.torch is not None and self._someone_else_profiles()  # the program's own
        if self.prof_kind != "steps":
            return True
        action = getattr(prof, "current_action", None)
        return action is not None and getattr(action, "name", "") != "NONE"

    def _time_step(self) -> None:
        """Step-to-step time, labelled by whether a profiler recorded during it: the
        unlabelled ("bare") intervals are the loop's unprofiled step time, measured in the
        same process as the window. On the host's clock always, and on the GPU's (events on
        the current stream, ``GpuStepClock``) once the program uses CUDA: the host's
        intervals are the loop's pace only when its launch queue is full or it waits for
        the GPU. Only the last _STEP_TIMES intervals are kept."""
        now = time.perf_counter_ns()
        profiling = self._profiling_now()
        # an interval is bare only if no profiler recorded at either end of it
        bare = not (profiling or self._last_step_profiling)
        if self._last_step_ns is not None:
            self._step_times.append((now - self._last_step_ns, bare, self.steps))
            if len(self._step_times) > _STEP_TIMES:
                del self._step_times[: len(self._step_times) - _STEP_TIMES]
        self._last_step_ns, self._last_step_profiling = now, profiling
        clock = self._gpu_clock
        if clock is None and self.torch is not None and not self._no_gpu_clock:
            try:
                cuda = self.torch.cuda
                if cuda.is_initialized():  # never start CUDA ourselves
                    clock = self._gpu_clock = GpuStepClock(cuda)
            except Exception:  # a torch without CUDA support, or one that fails here: host clock only
                self._no_gpu_clock = True
        if clock is not None:
            clock.mark(bare, self.steps)

    def _step_time_summary(self) -> dict:
        """Median step intervals (ms) outside and inside the profiler's recording, on the
        GPU's clock where it timed at least ``MIN_BARE_STEPS`` bare steps (``clock``: "gpu";
        the host's medians beside them), else on the host's. The first _STEP_WARMUP steps of
        the program (compilation, allocator warm-up) and the step in which a window ended (its
        trace was saved then) are left out."""
        left_out = self._window_end_steps + self._flop_steps
        host = _step_medians([(d / 1e6, bare, k) for d, bare, k in self._step_times], left_out)
        clock = self._gpu_clock
        gpu = _step_medians(clock.times, left_out) if clock is not None else None
        if gpu is not None and gpu["bare_n"] >= MIN_BARE_STEPS:
            return {"clock": "gpu", **gpu, "host_bare_ms": host["bare_ms"], "host_profiled_ms": host["profiled_ms"]}
        out = {"clock": "host", **host}
        if clock is not None and clock.failed:
            out["gpu_clock_failed"] = clock.failed
        return out

    def _note_stall(self, held_s: float) -> None:
        save = self.last_save_s
        self.notes.append(
            f"the window's end held the program {held_s * 1e3:.0f} ms (stopping torch.profiler and saving its trace"
            + (f", the save {save * 1e3:.0f} ms of it" if save is not None else "")
            + "); the trace is compressed off the training thread"
        )

    def _back_to_steps(self) -> None:
        """Steps arrived after the time-window fallback: that window was only standing in for
        them (model loading, data preparation...). Close it and record the step window.

        The fallback window is saved at once, never dropped: a Kineto session stopped and
        not saved at once left every later kernel launch of the process slower (see
        ``_export``). It goes to traces/startup/, which analysis skips."""
        self._provisional = False
        self._join_exports(_JOIN_S)
        if self.prof is not None:
            prof, self.prof, self.prof_kind = self.prof, None, None
            t0 = time.perf_counter()
            prof.stop()
            self._export(prof, "", background=False, folder="startup")
            self._settle()
            held_s = time.perf_counter() - t0
        else:
            held_s = 0.0
        startup = os.path.join(self.run_dir, "traces", "startup")
        for t in self.traces:  # the fallback window, already closed and written
            try:
                os.makedirs(startup, exist_ok=True)
                dst = os.path.join(startup, os.path.basename(t))
                os.replace(t, dst)
                self.startup_traces.append(dst)
            except OSError:
                pass
        self.traces = []
        self.notes = [n for n in self.notes if not any(k in n for k in ("time window", "window's end", "trace compressed"))]
        self.notes.append(
            "steps began after the time-window fallback had started: recorded the step window instead "
            f"(the fallback window is kept in traces/startup/, not analysed; closing it held the program {held_s * 1e3:.0f} ms)"
        )
        if self._alarm_phase is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self._alarm_phase = None
        self.done = False
        self._step_base = self.steps - 1  # the step window counts from here
        self._start_steps(hook=False)

    def _stand_aside(self) -> None:
        self.notes.append("the program runs its own torch.profiler: proflab recorded nothing over it")
        self.prof, self.prof_kind, self.done = None, None, True

    def _fail(self, what: str, e: Exception) -> None:
        """proflab's own failure, met inside a call from the program (a step, a capture
        block, the SIGALRM handler): say why, record nothing more, and let the program go on."""
        self.failure = f"{what}: {type(e).__name__}: {e}"
        self.notes.append(self.failure)
        self.prof, self.prof_kind, self.done = None, None, True

    def _on_trace_ready(self, prof) -> None:
        self._export(prof, background=not self._finished)
        self.done = True
        self._settle()

    def _trace_path(self, suffix: str = "", folder: str = "") -> str:
        rank = os.environ.get("RANK")
        who = f"rank{rank}_{self.pid}" if rank is not None else f"{socket.gethostname()}_{self.pid}"
        return os.path.join(self.run_dir, "traces", folder, f"{who}{suffix}.pt.trace.json.gz")

    def _export(self, prof, suffix: str = "", background: bool = False, folder: str = "") -> None:
        """Write ``prof``'s trace into traces/: Kineto saves the JSON here, on the calling
        (training) thread, right after the stop; with ``background`` the compression runs on a
        thread of its own while the program goes on.

        Why the save stays on the training thread: on an H100 with PyTorch 2.11, every run
        in which the program launched kernels between a profiler's stop and the save of its
        result (the save on another thread, a later save, no save) went on 12-45 % slower
        for good; every run whose result was saved at once did not
        (benchmarks/probe_profiler_residue.py and bench_run_overhead.py)."""
        final = self._trace_path(suffix, folder=folder)
        # One folder per process: another rank of the run tidying up its own must not
        # remove it while Kineto is still writing here.
        tmp_dir = os.path.join(self.run_dir, "traces", f".partial-{self.pid}")
        tmp = os.path.join(tmp_dir, os.path.basename(final))
        raw = tmp[: -len(".gz")]
        t0 = time.perf_counter()
        try:
            os.makedirs(tmp_dir, exist_ok=True)
            prof.export_chrome_trace(raw)  # plain JSON: torch's own .gz path compresses line by line
        except Exception as e:
            self._export_failed(e)
            return
        self.last_save_s = time.perf_counter() - t0
        if not background:
            self._compress(raw, tmp, tmp_dir, final, background=False)
            return
        t = threading.Thread(
            target=self._compress, args=(raw, tmp, tmp_dir, final, True), name="proflab-compress", daemon=True
        )
        self._exports.append(t)
        t.start()

    def _compress(self, raw: str, tmp: str, tmp_dir: str, final: str, background: bool) -> None:
        t0 = time.perf_counter()
        try:
            with open(raw, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
            os.remove(raw)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.replace(tmp, final)  # readers never see half a trace
            with self._info_lock:
                (self.startup_traces if os.path.basename(os.path.dirname(final)) == "startup" else self.traces).append(final)
                if background:
                    self.notes.append(
                        f"trace compressed in {time.perf_counter() - t0:.2f} s off the training thread "
                        f"({os.path.getsize(final) / 2**20:.1f} MiB)"
                    )
            try:
                os.rmdir(tmp_dir)
            except OSError:  # a failed export's leftover: keep it for inspection
                pass
        except Exception as e:
            self._export_failed(e)
        self._write_process_info()

    def _export_failed(self, e: Exception) -> None:
        with self._info_lock:
            self.failure = self.failure or f"trace export failed: {type(e).__name__}: {e}"
            self.notes.append(f"trace export failed: {type(e).__name__}: {e}")
        self._write_process_info()

    def _join_exports(self, timeout_s: float | None = None) -> None:
        for t in self._exports:
            if t is not threading.current_thread():
                t.join(timeout_s)
        self._exports = [t for t in self._exports if t.is_alive()]

    # -- the time window (SIGALRM: the handler runs on the main thread) ----------------------

    def _arm_time_window(self) -> None:
        delay = float(self.cfg.get("delay_s") or 0.0)
        if threading.current_thread() is not threading.main_thread():
            self.notes.append("torch was first imported off the main thread: no time window")
            return
        if signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None):
            self.notes.append("the program handles SIGALRM itself: no time window")
            return
        signal.signal(signal.SIGALRM, self._on_alarm)
        self._alarm_phase = "start"
        self._armed_at = time.perf_counter()
        if delay <= 0 and self.window == "time":
            self._on_alarm(signal.SIGALRM, None)
        elif self.window == "auto" and self._cuda_possible():
            signal.setitimer(signal.ITIMER_REAL, min(_RETRY_S, max(delay, 1e-3)))  # polls for the first CUDA work
        else:
            signal.setitimer(signal.ITIMER_REAL, max(delay, 1e-3))

    def _cuda_possible(self) -> bool:
        try:
            return bool(self.torch.cuda.is_available())
        except Exception:
            return False

    def _wait_for_cuda(self) -> bool:
        """Window auto, no step yet, polling: whether the time window should wait longer (and the
        timer is re-armed). It starts ``_CUDA_GRACE_S`` after the program's CUDA context first
        exists, or ``delay_s`` after the torch import, whichever comes first."""
        if self._armed_at is None or not self._cuda_possible():
            return False
        now = time.perf_counter()
        left = float(self.cfg.get("delay_s") or 0.0) - (now - self._armed_at)
        try:
            if self._cuda_since is None and self.torch.cuda.is_initialized():
                self._cuda_since = now
        except Exception:
            pass
        if self._cuda_since is not None:
            left = min(left, _CUDA_GRACE_S - (now - self._cuda_since))
        if left <= 0:
            return False
        signal.setitimer(signal.ITIMER_REAL, min(_RETRY_S, left))
        return True

    def _on_alarm(self, signum, frame) -> None:
        # A signal handler: whatever it raises surfaces in the program's own code. It may
        # interrupt the program anywhere, so it acts only at a safe point and otherwise asks
        # again shortly (an import in progress ends in milliseconds to seconds).
        if self._alarm_phase == "start" and self.window == "auto" and self.steps > 0:
            if self._deferred_since is not None:  # it waited, and the steps came first
                self._deferred_s += time.perf_counter() - self._deferred_since
            self._alarm_phase, self._deferred_since = None, None  # steps came: no fallback needed
            return
        if self._alarm_phase == "start" and self.window == "auto" and self._deferred_since is None and self._wait_for_cuda():
            return
        try:
            why = self._not_a_safe_point()
        except Exception as e:  # cannot tell: treat as unsafe rather than risk the program
            why = f"the safe-point check failed ({type(e).__name__})"
        if why is not None and self._alarm_phase is not None:
            now = time.perf_counter()
            if self._deferred_since is None:
                self._deferred_since = now
            if why not in self._deferred_why:
                self._deferred_why.append(why)
            signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
            return
        if self._deferred_since is not None:
            waited = time.perf_counter() - self._deferred_since
            self._deferred_s += waited
            self._deferred_since = None
            self.notes.append(f"the time window waited {waited:.2f} s for a safe point ({'; '.join(self._deferred_why)})")
        with self._lock:
            try:
                self._alarm()
            except Exception as e:
                self._alarm_phase = None
                self._fail("the time window failed", e)

    def _alarm(self) -> None:
        if self._alarm_phase == "start":
            if self.done or (self.window == "auto" and self.steps > 0):
                return  # steps arrived: the step window records
            if self.prof is not None:  # the step profiler, still waiting: nothing recorded
                self.prof.stop()
            self.prof = self._profiler()
            self._wait_settled()
            self.prof.start()
            self.prof_kind = "time"
            self._provisional = self.window == "auto"
            self._note_cuda_at_start()
            self.notes.append(
                (f"no training step within {_CUDA_GRACE_S:g} s of the first CUDA work" if self._cuda_since is not None
                 else f"no training step within {self.cfg.get('delay_s')} s of the torch import")
                + f": recorded a time window of {self.cfg.get('duration_s')} s instead"
                if self.window == "auto" else "recorded a time window"
            )
            self._alarm_phase = "stop"
            signal.setitimer(signal.ITIMER_REAL, float(self.cfg.get("duration_s") or 10.0))
        elif self._alarm_phase == "stop":
            self._alarm_phase = None
            self._stop_and_export()

    def _note_cuda_at_start(self) -> None:
        try:
            cuda = self.torch.cuda
            if cuda.is_available() and not cuda.is_initialized():
                self.notes.append("the time window started before the program had created its CUDA context")
        except Exception:
            pass

    def _stop_and_export(self) -> None:
        prof, kind, self.prof, self.prof_kind = self.prof, self.prof_kind, None, None
        if prof is None:
            return
        if kind == "steps":
            # stop() closes an open active window through on_trace_ready; a window still
            # waiting or warming up has recorded nothing.
            prof.stop()
            if not self.done:
                need = sum(int(self.cfg.get(k, d)) for k, d in (("wait", 3), ("warmup", 1)))
                self.notes.append(
                    f"the program made {self.steps} step(s) ({self.step_source or 'none seen'}); the step window "
                    f"starts after {need}: no trace (use --window time, or fewer --wait steps)"
                )
        else:
            t0 = time.perf_counter()
            prof.stop()
            self._export(prof, "_capture" if kind == "capture" else "", background=not self._finished)
            if not self._finished:
                self._note_stall(time.perf_counter() - t0)
            self._settle()
        self.done = True

    # -- capture ranges ----------------------------------------------------------------------

    def capture_start(self, source: str = "capture") -> None:
        """A capture range opens: ``proflab.capture()`` (source ``capture``), or the program's
        ``cudaProfilerStart`` (``cuda-profiler-api``); the window's own kind of range only."""
        with self._lock:
            if source != self.window:
                return
            self._captures += 1
            if self.torch is None or self.done or self._captures > 1 or not self.profiles:
                if self._captures == 2 and source == "cuda-profiler-api":
                    self.notes.append("the program opened more than one cudaProfilerStart/Stop range: the first is "
                                      "recorded (as nsys --capture-range-end=stop does)")
                return
            what = "proflab.capture()" if source == "capture" else "cudaProfilerStart"
            try:
                self.prof = self._profiler()
                self._wait_settled()
                self.prof.start()
                self.prof_kind = "capture"
                if source == "cuda-profiler-api":
                    self.notes.append(f"recorded the program's first cudaProfilerStart/Stop range (thread "
                                      f"{threading.current_thread().name})")
            except Exception as e:
                self._fail(f"could not start torch.profiler for {what}", e)

    def capture_stop(self, source: str = "capture") -> None:
        with self._lock:
            if source == self.window and self.prof_kind == "capture":
                try:
                    self._stop_and_export()
                except Exception as e:
                    what = "proflab.capture()" if source == "capture" else "the cudaProfilerStart/Stop range"
                    self._fail(f"stopping torch.profiler at the end of {what} failed", e)

    # -- the program's cudaProfilerStart/Stop ranges (--capture cuda-profiler-api) -------------

    def _hook_cuda_profiler_api(self, torch) -> None:
        """Wrap the CUDA runtime module's cudaProfilerStart/Stop (``torch.cuda.cudart()``'s, which
        ``torch.cuda.profiler.start``/``stop`` call): every Python caller goes through them."""
        rt = getattr(torch._C, "_cudart", None)
        if rt is None:
            self.notes.append("this torch has no CUDA runtime module (a build without CUDA): the program cannot call "
                              "cudaProfilerStart, so --capture cuda-profiler-api records nothing")
            return
        start, stop = rt.cudaProfilerStart, rt.cudaProfilerStop
        if getattr(start, "_proflab_wrapped", False):
            return
        runtime = self

        def ok(res) -> bool:
            try:
                return res == rt.cudaError.success
            except Exception:
                return False

        def cudaProfilerStart(*args, **kwargs):
            res = start(*args, **kwargs)
            if ok(res):
                runtime.capture_start(source="cuda-profiler-api")
            return res

        def cudaProfilerStop(*args, **kwargs):
            res = stop(*args, **kwargs)
            if ok(res):
                runtime.capture_stop(source="cuda-profiler-api")
            return res

        for f, real in ((cudaProfilerStart, start), (cudaProfilerStop, stop)):
            f._proflab_wrapped = True
            f.__wrapped__ = real
            f.__doc__ = getattr(real, "__doc__", None)
        rt.cudaProfilerStart, rt.cudaProfilerStop = cudaProfilerStart, cudaProfilerStop

    # -- events ------------------------------------------------------------------------------

    def record(self, event: dict) -> None:
        """Append one event to events.jsonl (flushed at once: survives a crash)."""
        with self._lock:
            if self._events is None:
                self._events = open(os.path.join(self.run_dir, "events.jsonl"), "a", encoding="utf-8")
            event = {"pid": os.getpid(), **event}  # a forked worker's events are its own
            self._events.write(json.dumps(event, default=str) + "\n")
            self._events.flush()

    # -- the end -----------------------------------------------------------------------------

    def finish(self) -> None:
        """Flush what was recorded. Runs at exit and on SIGTERM; safe to call twice.

        Only in the process that started the runtime: a forked child holds a copy of its
        profiler, and stopping or exporting that copy would write the parent's trace and
        process file (same pid in the names) from the child's half of the state."""
        if os.getpid() != self.pid:
            return
        with self._lock:
            if self._finished:
                return
            self._finished = True
            self._mark_exit(exit_handler_started_s=time.time())
            end_without_teardown()
            # A second Ctrl-C must not cut the export short.
            old = None
            if threading.current_thread() is threading.main_thread():
                old = signal.signal(signal.SIGINT, signal.SIG_IGN)
                if self._alarm_phase is not None:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            if self._deferred_since is not None and not (self.window == "auto" and self.steps > 0):
                self.notes.append(
                    f"the time window was still waiting for a safe point ({'; '.join(self._deferred_why)}) when the program "
                    f"ended, {time.perf_counter() - self._deferred_since:.1f} s after it was due"
                )
            if self._flop_count is not None:
                self._flop_count.abandon()
                self._flop_count = None
                self._flops = {"missing": "the program ended inside the step whose FLOPs were being counted"}
            try:
                self._stop_and_export()
            except Exception as e:
                self.failure = self.failure or f"stopping torch.profiler failed: {type(e).__name__}: {e}"
                self.notes.append(f"stopping torch.profiler failed: {type(e).__name__}: {e}")
            self._stop_program_profilers()
            self._settle_at_exit()
            self._join_exports(_JOIN_S)  # a trace still being compressed is finished first
            self._dump_memory_snapshot()
            if self._gpu_clock is not None:
                self._gpu_clock.drain()  # the last steps' events, as far as the GPU got
            self._write_process_info()
            if self._events is not None:
                self._events.close()
            self._mark_exit(exit_handler_done_s=time.time())
            if old is not None:
                signal.signal(signal.SIGINT, old)

    def _dump_memory_snapshot(self) -> None:
        torch = self.torch
        if torch is None or not self.cfg.get("memory_snapshot") or not self.profiles:
            return
        if not torch.cuda.is_available():
            self.notes.append("--memory-snapshot: no CUDA device, no snapshot")
            return
        try:
            # Converted here, inside the profiled process, to gzipped JSON: a pickle is never
            # written, so nothing downstream has to unpickle a file (the snapshot holds only
            # dicts, lists, strings and numbers; anything else is written as its repr).
            import gzip
            import json

            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            path = os.path.join(self.run_dir, f"memory_snapshot_{self.pid}.json.gz")
            with gzip.open(path + ".tmp", "wt", encoding="utf-8", compresslevel=6) as fh:
                json.dump(snap, fh, default=repr, separators=(",", ":"))
            os.replace(path + ".tmp", path)
        except Exception as e:
            self.notes.append(f"CUDA memory snapshot failed: {type(e).__name__}: {e}")

    def _why_no_trace(self) -> str | None:
        """One line: why this process, profiled, ended without a trace (None when it has one)."""
        if not self.profiles or self.torch is None or self.traces:
            return None
        if self.failure:
            return self.failure
        if self._own_traces or any("its own torch.profiler" in n for n in self.notes):
            return "the program ran its own torch.profiler, and it recorded nothing proflab could copy"
        if self._deferred_since is not None:
            return f"the time window never found a safe point to start ({'; '.join(self._deferred_why)})"
        need = sum(int(self.cfg.get(k, d)) for k, d in (("wait", 3), ("warmup", 1))) + 1
        if self.window in ("auto", "steps") and self.steps - self._step_base < need:
            return (
                f"the program made {self.steps} step(s) ({self.step_source or 'none seen'}); the step window "
                f"records from step {need}"
                + ("" if self.window == "steps" else f", and it ended before the time window ({self.cfg.get('delay_s')} s after the "
                   f"torch import, or {_CUDA_GRACE_S:g} s after its first CUDA work)")
            )
        if self.window == "capture":
            return "no proflab.capture() block ran"
        if self.window == "cuda-profiler-api":
            if any("no CUDA runtime module" in n for n in self.notes):
                return "--capture cuda-profiler-api: this torch has no CUDA (a CPU build): no cudaProfilerStart can succeed"
            return ("--capture cuda-profiler-api: the program made no successful cudaProfilerStart call from Python "
                    "(torch.cuda.profiler.start(), torch.cuda.cudart().cudaProfilerStart()); a C++ runtime's calls are "
                    "seen by --backend nsys only")
        return "no window closed before the program ended"

    def _compile_record(self) -> dict | None:
        try:
            return _sibling("_child_compiled").compile_record()
        except Exception as e:  # proflab's to lose, never the program's
            return {"missing": f"reading torch.compile's record failed: {type(e).__name__}: {e}"}

    def _write_process_info(self) -> None:
        torch = self.torch
        info = {
            "pid": self.pid,
            "argv": sys.argv,
            "python": sys.version.split()[0],
            "rank": os.environ.get("RANK"),
            "torch": getattr(torch, "__version__", None) if torch else None,
            "torch_cuda": getattr(getattr(torch, "version", None), "cuda", None) if torch else None,
            "profiled": self.profiles and torch is not None,
            "window": self.prof_kind or self.window,
            "steps": self.steps,
            "step_source": self.step_source,
            "traces": [os.path.relpath(t, self.run_dir) for t in self.traces],
            "startup_traces": [os.path.relpath(t, self.run_dir) for t in self.startup_traces],
            "why_no_trace": self._why_no_trace() if self._finished else None,
            # how long the time window waited for a safe point, and for what (s)
            "time_window_waited_s": round(
                self._deferred_s + (0.0 if self._deferred_since is None else time.perf_counter() - self._deferred_since), 3
            ),
            "time_window_waited_for": self._deferred_why,
            # step-to-step wall time (ms) without and with a profiler recording
            "step_times": self._step_time_summary(),
            # one unprofiled step's FLOPs (_child_compiled.FlopCount), or why there are none
            "flops": self._flops,
            # what torch.compile did in this process (graph breaks, recompiles, CUDA graph skips)
            "compile": self._compile_record(),
            "notes": self.notes,
        }
        d = os.path.join(self.run_dir, "processes")
        try:
            with self._info_lock:  # the compression thread writes this file too
                os.makedirs(d, exist_ok=True)
                tmp = os.path.join(d, f".{self.pid}.json.tmp")
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump(info, f, indent=2, default=str)
                os.replace(tmp, os.path.join(d, f"{self.pid}.json"))
        except OSError:
            pass  # the run directory went away; nothing to tell


class _TorchImportHook:
    """A meta-path finder that calls ``runtime.on_torch`` once ``import torch`` completes."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once; and the lookup below must not find us again
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, runtime = spec.loader, self.runtime
        exec_module = loader.exec_module

        def exec_and_hook(module):
            exec_module(module)
            runtime.on_torch(module)

        loader.exec_module = exec_and_hook
        return spec



def _initializing_modules() -> set[str]:
    """The modules whose import is under way (in any thread): what Python calls "partially
    initialized" when something imports from them."""
    out = set()
    for name, m in list(sys.modules.items()):
        try:
            spec = vars(m).get("__spec__")  # not getattr: a lazy module's __getattr__ may import
        except TypeError:
            continue
        if spec is not None and getattr(spec, "_initializing", False):
            out.add(name)
    return out


def _serve_later_exports(recorded, copy_path: str) -> None:
    """Kineto saves a trace once ("Trace is already saved" the second time): the program's own
    export of this trace (its on_trace_ready handler, or a later export_chrome_trace call)
    is served from proflab's copy instead, byte for byte the JSON it would have written."""

    def export_chrome_trace(path, *args, **kwargs):
        import gzip
        import shutil

        with gzip.open(copy_path, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)

    recorded.export_chrome_trace = export_chrome_trace


RUNTIME: Runtime | None = None


def start() -> Runtime | None:
    """Start the runtime once, when ``proflab run`` asked for it (the bootstrap calls this)."""
    global RUNTIME
    raw = os.environ.get(CONFIG_ENV)
    if raw and RUNTIME is None:
        RUNTIME = Runtime(json.loads(raw))
        RUNTIME.install()
    return RUNTIME
