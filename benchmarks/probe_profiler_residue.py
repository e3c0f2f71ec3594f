"""What a torch.profiler session leaves behind in a process: per-launch and per-op cost after
0, 1 or 2 sessions, started before or after the CUDA context exists, exported or not.

    python benchmarks/probe_profiler_residue.py            # every scenario, one fresh process each

Each scenario runs in a fresh interpreter (what a session leaves is per process) and prints one
JSON line: the CPU time of one eager CUDA launch (``x.add_(1)`` on a 1-element tensor, no
sync in the timed loop, median of 7 batches of 2000), of one CPU op (``torch.add`` on 16
floats), and of one small eager MLP+AdamW step (synchronised), each before and after the
scenario's sessions where "before" exists. Environment variants show which Kineto/CUPTI
setting the residue depends on.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time

SCENARIOS = {
    # name: (sessions, when the first starts, export each?, extra env)
    "bare": ([], "after", {}),
    "one_exported": (["export"], "after", {}),
    "one_dropped": (["drop"], "after", {}),
    "dropped_then_exported": (["drop", "export"], "after", {}),
    "first_loads_in_session": (["drop", "export"], "loads", {}),
    "before_ctx_dropped": (["drop"], "before", {}),
    "before_ctx_then_exported": (["drop", "export"], "before", {}),
    "before_ctx_then_exported_noshapes": (["drop", "export"], "before", {"_SHAPES": "0"}),
    "before_ctx_then_exported_no_lazy_reinit": (["drop", "export"], "before", {"DISABLE_CUPTI_LAZY_REINIT": "1"}),
    "before_ctx_then_exported_no_teardown": (["drop", "export"], "before", {"TEARDOWN_CUPTI": "0"}),
    "dropped_then_exported_no_lazy_reinit": (["drop", "export"], "after", {"DISABLE_CUPTI_LAZY_REINIT": "1"}),
    # the stopped session's result kept alive, measured, then saved and measured again
    "dropped_kept_then_saved": (["keep"], "after", {}),
    # the stopped session's result freed at once (del + gc.collect())
    "dropped_collected": (["dropgc"], "after", {}),
    # with CUPTI teardown (what proflab run sets): one session, two, a dropped one then a saved
    # one, and the same without lazy re-initialisation
    "one_exported_teardown": (["export"], "after", {"TEARDOWN_CUPTI": "1"}),
    "two_exported_teardown": (["export", "export"], "after", {"TEARDOWN_CUPTI": "1"}),
    "dropped_then_exported_teardown": (["drop", "export"], "after", {"TEARDOWN_CUPTI": "1"}),
    "dropped_then_exported_teardown_no_lazy_reinit": (["drop", "export"], "after", {"TEARDOWN_CUPTI": "1", "DISABLE_CUPTI_LAZY_REINIT": "1"}),
    "before_ctx_then_exported_teardown": (["drop", "export"], "before", {"TEARDOWN_CUPTI": "1"}),
    # The second session's start separated from the first's stop: by unprofiled steps (CUDA
    # calls, on which Kineto's asynchronous teardown finalises CUPTI) or by an idle sleep.
    "two_exported_teardown_steps0.05": (["export", "steps0.05", "export"], "after", {"TEARDOWN_CUPTI": "1"}),
    "two_exported_teardown_steps0.5": (["export", "steps0.5", "export"], "after", {"TEARDOWN_CUPTI": "1"}),
    "two_exported_teardown_steps2": (["export", "steps2", "export"], "after", {"TEARDOWN_CUPTI": "1"}),
    "two_exported_teardown_sleep0.5": (["export", "sleep0.5", "export"], "after", {"TEARDOWN_CUPTI": "1"}),
    "two_exported_teardown_settle": (["export", "settle", "export"], "after", {"TEARDOWN_CUPTI": "1"}),
    "dropped_then_exported_teardown_steps0.5": (["drop", "steps0.5", "export"], "after", {"TEARDOWN_CUPTI": "1"}),
    # a session in which the program launched nothing (a fallback window over a sleeping start-up)
    "idle_exported_teardown": (["idle"], "after", {"TEARDOWN_CUPTI": "1"}),
    "idle_exported_teardown_then_exported": (["idle", "steps0.5", "export"], "after", {"TEARDOWN_CUPTI": "1"}),
    "idle_exported_default_env": (["idle"], "after", {}),
    # the process's kernels first loaded inside the session (a fallback window over the
    # first iteration), then nothing more, or a second session after unprofiled steps
    "loads_exported_teardown": (["export"], "loads", {"TEARDOWN_CUPTI": "1"}),
    "loads_exported_teardown_then_exported": (["export", "steps0.5", "export"], "loads", {"TEARDOWN_CUPTI": "1"}),
    # what `proflab run` does after each of its sessions (settle_cupti_teardown), then the
    # next session at once: after a session with CUDA work, and after one over an idle stretch
    "two_exported_teardown_proflab_settle": (["export", "proflab_settle", "export"], "after", {"TEARDOWN_CUPTI": "1"}),
    "idle_then_exported_teardown_proflab_settle": (["idle", "proflab_settle", "export"], "after", {"TEARDOWN_CUPTI": "1"}),
}


def graph_kernel_timer(torch, kernels: int = 500, repeats: int = 7):
    """A function giving the GPU time (us, median of ``repeats`` replays) of one tiny kernel
    replayed from a CUDA graph of ``kernels``: no host in it, so what it shows is what stays on
    in the GPU's path. 1.00 us on an H100 with CUPTI detached; 1.22-1.51 us while CUPTI's
    kernel tracing stays on. Used by the GPU tests of ``proflab run`` too."""
    x = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as graph capture wants
        for _ in range(3):
            x.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(kernels):
            x.add_(1)

    def kernel_us() -> float:
        per = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            per.append(a.elapsed_time(b) * 1e3 / kernels)
        return statistics.median(per)

    return kernel_us


def child(name: str) -> None:
    sessions, when, _ = SCENARIOS[name]
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile

    shapes = os.environ.get("_SHAPES", "1") == "1"
    out: dict = {"scenario": name}

    def session(kind: str, work) -> None:
        if kind.startswith("steps"):  # unprofiled steps for this many seconds
            end = time.perf_counter() + float(kind[5:])
            while time.perf_counter() < end:
                step_ms(1)
            return
        if kind.startswith("sleep"):
            time.sleep(float(kind[5:]))
            return
        if kind == "settle":  # a few CUDA calls spread over 0.2 s, then on
            for _ in range(4):
                torch.cuda.synchronize()
                time.sleep(0.05)
            return
        if kind == "proflab_settle":
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
            from proflab.collect._child import settle_cupti_teardown

            t = settle_cupti_teardown(torch)
            if t is not None:
                t.join()
            return
        if kind == "idle":
            work, kind = (lambda: time.sleep(1.0)), "export"
        p = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=shapes)
        p.start()
        work()
        t0 = time.perf_counter()
        p.stop()
        out.setdefault("stop_ms", []).append(round((time.perf_counter() - t0) * 1e3, 1))
        if kind == "export":
            t0 = time.perf_counter()
            p.export_chrome_trace(f"/tmp/probe_{os.getpid()}.json")
            out.setdefault("export_ms", []).append(round((time.perf_counter() - t0) * 1e3, 1))
        elif kind == "keep":
            kept.append(p)
        elif kind == "dropgc":
            del p
            gc.collect()

    def launch_us() -> float:
        x = torch.zeros(1, device="cuda")
        per = []
        for _ in range(7):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(2000):
                x.add_(1)
            per.append((time.perf_counter() - t0) / 2000 * 1e6)
            torch.cuda.synchronize()
        return round(statistics.median(per), 3)

    def cpu_op_us() -> float:
        a, b = torch.randn(16), torch.randn(16)
        per = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(2000):
                torch.add(a, b)
            per.append((time.perf_counter() - t0) / 2000 * 1e6)
        return round(statistics.median(per), 3)

    def api_us() -> float:  # one CUDA runtime call that launches nothing (cudaStreamQuery)
        s = torch.cuda.current_stream()
        per = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(2000):
                s.query()
            per.append((time.perf_counter() - t0) / 2000 * 1e6)
        return round(statistics.median(per), 3)

    def measure() -> dict:
        if "graph" not in state:
            state["graph"] = graph_kernel_timer(torch)
        return {"launch_us": launch_us(), "api_us": api_us(), "graph_kernel_us": round(state["graph"](), 3), "cpu_op_us": cpu_op_us(), "step_ms": step_ms()}

    state: dict = {}
    kept: list = []

    def build():
        torch.manual_seed(0)
        m = nn.Sequential(*[nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)) for _ in range(8)]).cuda()
        state["m"], state["opt"] = m, torch.optim.AdamW(m.parameters(), lr=1e-4)
        state["x"] = torch.randn(64, 256, device="cuda")

    def step_ms(n=60) -> float:
        m, opt, x = state["m"], state["opt"], state["x"]
        per = []
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            per.append((time.perf_counter() - t0) * 1e3)
        return round(statistics.median(per), 3)

    def warm():
        build()
        step_ms(5)
        launch_us()

    rest = list(sessions)
    if when == "before" and rest:  # the first session starts before the CUDA context exists
        session(rest.pop(0), warm)
    elif when == "loads" and rest:  # after the context, but the first kernels load inside it
        torch.zeros(1, device="cuda")
        session(rest.pop(0), warm)
    else:
        warm()
        out["before"] = measure()
        if rest:
            session(rest.pop(0), lambda: step_ms(3))
    for kind in rest:
        session(kind, lambda: step_ms(3))
    out["after"] = measure()
    for p in kept:
        p.export_chrome_trace(f"/tmp/probe_{os.getpid()}.json")
        out["after_save"] = measure()
    out["profiler_enabled"] = bool(torch._C._autograd._profiler_enabled())
    out["env"] = {k: v for k, v in SCENARIOS[name][2].items()}
    print(json.dumps(out), flush=True)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
    names = sys.argv[1:] or list(SCENARIOS)
    for name in names:
        env = {**os.environ, **SCENARIOS[name][2]}
        r = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True, text=True, timeout=120)
        line = [l for l in r.stdout.splitlines() if l.startswith("{")]
        print(line[-1] if line else json.dumps({"scenario": name, "rc": r.returncode, "stderr": r.stderr[-800:]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
