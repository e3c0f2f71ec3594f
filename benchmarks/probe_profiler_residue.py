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
}


def child(name: str) -> None:
    sessions, when, _ = SCENARIOS[name]
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile

    shapes = os.environ.get("_SHAPES", "1") == "1"
    out: dict = {"scenario": name}

    def session(kind: str, work) -> None:
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
        out["before"] = {"launch_us": launch_us(), "cpu_op_us": cpu_op_us(), "step_ms": step_ms()}
        if rest:
            session(rest.pop(0), lambda: step_ms(3))
    for kind in rest:
        session(kind, lambda: step_ms(3))
    out["after"] = {"launch_us": launch_us(), "cpu_op_us": cpu_op_us(), "step_ms": step_ms()}
    for p in kept:
        p.export_chrome_trace(f"/tmp/probe_{os.getpid()}.json")
        out["after_save"] = {"launch_us": launch_us(), "cpu_op_us": cpu_op_us(), "step_ms": step_ms()}
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
