"""Why a profiled GPU program can hang at exit: each scenario runs in a fresh process, bounded
in wall time; a process still alive at the bound has its threads' native stacks taken with
cuda-gdb (where it is on PATH), then it is killed.

    python benchmarks/probe_exit_hang.py [--out DIR] [--bound S] [--only NAME...]

One JSON line per scenario: whether it returned, its exit status, its wall time, and for a
hang the innermost frames of each thread (the full stacks go to DIR/<scenario>.stacks.txt).

The scenarios separate proflab from torch.profiler itself: a time window still open when the
program exits (what `proflab run` records when a short program never steps), the same with
Kineto's CUPTI teardown off, and plain torch.profiler sessions stopped at exit with and
without that teardown, with and without CUDA calls after the stop.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# A GPU program with no steps: bf16 matmuls for SECONDS, then exit (PROBE_MODE picks what
# happens to a torch.profiler session of its own; "none": proflab's window only).
PROGRAM = r"""
import atexit, os, sys, time
import torch
mode = os.environ.get("PROBE_MODE", "none")
seconds = float(sys.argv[1])
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
prof = None
if mode != "none":
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
    prof.start()
def at_exit():
    if prof is None or mode == "never_stopped":
        return
    prof.stop()
    prof.export_chrome_trace(os.path.join(os.environ["PROBE_DIR"], f"own_{os.getpid()}.json"))
    if mode == "stop_then_calls":
        for _ in range(15):
            torch.cuda.current_device()
            time.sleep(0.01)
if mode in ("atexit_stop", "never_stopped", "stop_then_calls"):
    atexit.register(at_exit)
t0 = time.perf_counter()
while time.perf_counter() - t0 < seconds:
    for _ in range(10):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
if mode == "stop_in_main":
    prof.stop()
    prof.export_chrome_trace(os.path.join(os.environ["PROBE_DIR"], f"own_{os.getpid()}.json"))
print("program done", flush=True)
"""

STEPS = r"""
import torch
model = torch.nn.Linear(4096, 4096).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(256, 4096, device="cuda")
for i in range(6):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
print("program done", flush=True)
"""

PROFLAB = [sys.executable, "-m", "proflab", "run", "--no-analyze", "--delay", "2", "--duration", "20"]

SCENARIOS = {
    # name: (argv template, extra env); {prog} is the program file, {steps} the steps program
    "run_time_window_open_at_exit": (PROFLAB + ["--", sys.executable, "{prog}", "6"], {}),
    "run_time_window_open_at_exit_teardown0": (PROFLAB + ["--", sys.executable, "{prog}", "6"], {"TEARDOWN_CUPTI": "0"}),
    "run_steps_window_open_at_exit": (PROFLAB + ["--", sys.executable, "{steps}"], {}),
    "torch_atexit_stop_teardown1": ([sys.executable, "{prog}", "3"], {"PROBE_MODE": "atexit_stop", "TEARDOWN_CUPTI": "1"}),
    "torch_atexit_stop_teardown0": ([sys.executable, "{prog}", "3"], {"PROBE_MODE": "atexit_stop", "TEARDOWN_CUPTI": "0"}),
    "torch_atexit_stop_then_calls_teardown1": ([sys.executable, "{prog}", "3"], {"PROBE_MODE": "stop_then_calls", "TEARDOWN_CUPTI": "1"}),
    "torch_never_stopped_teardown1": ([sys.executable, "{prog}", "3"], {"PROBE_MODE": "never_stopped", "TEARDOWN_CUPTI": "1"}),
    "torch_stop_in_main_teardown1": ([sys.executable, "{prog}", "3"], {"PROBE_MODE": "stop_in_main", "TEARDOWN_CUPTI": "1"}),
}


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _stacks(pid: int) -> str:
    gdb = shutil.which("cuda-gdb") or shutil.which("gdb")
    if gdb is None:
        return "(no cuda-gdb or gdb on PATH)"
    try:
        r = subprocess.run(
            [gdb, "-q", "-batch", "-p", str(pid), "-ex", "info threads", "-ex", "thread apply all bt 25"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        return r.stdout + r.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({gdb} failed: {e})"


def _innermost(stacks: str) -> list[str]:
    """Each thread's first frames that are not libc/pthread waits: where it is stuck."""
    out, cur = [], None
    for line in stacks.splitlines():
        if line.startswith("Thread "):
            cur = [line.split("(")[0].strip()]
            out.append(cur)
        elif cur is not None and re.match(r"#\d+ ", line) and len(cur) < 7:
            m = re.search(r"in (\S+)", line) or re.match(r"#\d+\s+(\S+)", line)
            if m:
                cur.append(m.group(1)[:80])
    return [" <- ".join(c) for c in out]


def run(name: str, argv: list[str], env: dict, bound: float, out: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        prog, steps = Path(tmp, "prog.py"), Path(tmp, "steps.py")
        prog.write_text(PROGRAM)
        steps.write_text(STEPS)
        argv = [a.format(prog=prog, steps=steps) for a in argv]
        e = {**os.environ, **env, "PROBE_DIR": tmp}
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=e, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            text, _ = proc.communicate(timeout=bound)
            return {"scenario": name, "returned": True, "status": proc.returncode, "wall_s": round(time.perf_counter() - t0, 2),
                    "tail": text.decode(errors="replace")[-300:]}  # fmt: skip
        except subprocess.TimeoutExpired:
            pass
        pids = _descendants(proc.pid)
        stacks = {}
        for p in pids:
            try:
                cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "-m proflab run" not in cmd:  # the launcher only waits on its child
                stacks[p] = (cmd[:200], _stacks(p))
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        with open(out / f"{name}.stacks.txt", "w") as f:
            for p, (cmd, s) in stacks.items():
                f.write(f"==== pid {p}: {cmd}\n{s}\n")
        return {
            "scenario": name, "returned": False, "wall_s": round(time.perf_counter() - t0, 2),
            "tail": text.decode(errors="replace")[-300:],
            "threads": {str(p): _innermost(s) for p, (cmd, s) in stacks.items()},
        }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".", help="where the stacks of hung scenarios go")
    ap.add_argument("--bound", type=float, default=30.0, help="seconds a scenario may run before it counts as hung")
    ap.add_argument("--only", nargs="*", help="scenarios to run (default: all)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, (argv, env) in SCENARIOS.items():
        if args.only and name not in args.only:
            continue
        print(json.dumps(run(name, argv, env, args.bound, out)), flush=True)


if __name__ == "__main__":
    main()
