"""The exit watch of ``proflab run``: a profiled process that does not end some seconds after
its main thread did is hung at exit; say what it was waiting for, keep what it recorded and
end it, so that ``proflab run`` never waits for ever.

Each process of the run writes ``processes/<pid>.exit`` as it ends (``_child.py``): when its
main thread finished and which non-daemon threads it then waited for, when proflab's exit
handler started (the program's own atexit handlers had run by then: proflab's was registered
first, so it runs last) and when it was done (the trace saved). A process past the timeout is
sent SIGTERM first (proflab's handler saves a window still open, where Python still runs),
then SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EXIT_MARK", "HUNG_AT_EXIT", "ExitWatch", "Hung"]

EXIT_MARK = ".exit"  # the runtime's name for it (collect/_child.py, which imports nothing of ours)
HUNG_AT_EXIT = 124  # the exit status of a run that hung at exit (timeout(1)'s)
TERM_GRACE_S = 10.0  # after SIGTERM, how long a hung process may take to save and end
# proflab's exit handler saving a window (a GPU profiler's stop and export can take seconds,
# more on a busy machine: 3 s was too few for a 2.5 s window of GPU work under six runs at
# once on an H200) is not a hang until this long
SAVING_S = 180.0


@dataclass(frozen=True)
class Hung:
    """A process that had not ended ``waited_s`` seconds after its main thread finished."""

    pid: int
    rank: str | None
    waited_s: float
    waiting_for: str  # what it was waiting for, in words
    saved: bool  # proflab's exit handler had finished (its trace, if any, was written)

    def line(self) -> str:
        who = f"rank {self.rank} (pid {self.pid})" if self.rank is not None else f"pid {self.pid}"
        return f"{who} hung at exit: not ended {self.waited_s:.0f} s after its main thread finished, waiting for {self.waiting_for}"


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not Path("/proc").is_dir() or Path(f"/proc/{pid}").exists()


def _of_run(pid: int, run_dir: Path) -> bool:
    """Whether ``pid`` is a process of this run (its environment names the run directory),
    so a pid reused by another program is never signalled. Where there is no /proc to ask,
    the mark's pid is taken as the run's."""
    if not Path("/proc/self").is_dir():
        return True
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # another user's process, or gone: not one of ours
        return False
    return f"PROFLAB_RUN_DIR={run_dir}".encode() in env.split(b"\0")


def _waiting_for(mark: dict) -> str:
    if mark.get("exit_handler_done_s") is not None:
        return ("native code after Python's exit handlers (proflab had saved what it recorded; C/C++ teardown "
                "such as CUDA's, CUPTI's or NCCL's did not return)")  # fmt: skip
    if mark.get("exit_handler_started_s") is not None:
        return "proflab's exit handler (stopping the profiler and saving its trace)"
    threads = mark.get("waiting_for_threads") or []
    if threads:
        return f"non-daemon thread(s) still running: {', '.join(threads[:8])}" + (" ..." if len(threads) > 8 else "")
    return "the program's own atexit handlers"


class ExitWatch:
    """Watch a run's processes for ones hung at exit; ``timeout_s`` 0 or less never fires."""

    def __init__(self, run_dir: Path, timeout_s: float) -> None:
        self.run_dir = Path(run_dir)
        self.timeout_s = timeout_s
        self.hung: list[Hung] = []
        self._ended: set[int] = set()

    def marks(self) -> list[dict]:
        d = self.run_dir / "processes"
        if not d.is_dir():
            return []
        return [m for p in sorted(d.glob(f"*{EXIT_MARK}")) if (m := _read(p)) and isinstance(m.get("pid"), int)]

    def check(self, now_s: float | None = None) -> list[Hung]:
        """The processes hung at exit now (not yet ended by ``end``)."""
        if self.timeout_s <= 0:
            return []
        now_s = time.time() if now_s is None else now_s
        out = []
        for m in self.marks():
            since = [m[k] for k in ("main_finished_s", "exit_handler_started_s") if isinstance(m.get(k), (int, float))]
            if not since or m["pid"] in self._ended:
                continue
            waited = now_s - min(since)
            limit = self.timeout_s
            saving = m.get("exit_handler_started_s") is not None and m.get("exit_handler_done_s") is None
            if saving:  # proflab's handler is saving the window: its own clock, and more time
                limit = max(limit, SAVING_S)
                waited = now_s - m["exit_handler_started_s"]
            if waited > limit and alive(m["pid"]) and _of_run(m["pid"], self.run_dir):
                out.append(Hung(m["pid"], m.get("rank"), waited, _waiting_for(m), m.get("exit_handler_done_s") is not None))
        return out

    def end(self, hung: list[Hung], grace_s: float = TERM_GRACE_S) -> None:
        """SIGTERM each hung process (where Python still runs, proflab's handler saves an open
        window), SIGKILL the ones still there after ``grace_s``."""
        for h in hung:
            self._ended.add(h.pid)
            self.hung.append(h)
            if not h.saved:
                _signal(h.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        left = [h for h in hung if not h.saved]
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [h for h in left if alive(h.pid)]
        for h in hung:
            if alive(h.pid):
                _signal(h.pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
