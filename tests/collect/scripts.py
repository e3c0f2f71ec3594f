"""Small programs that the run tests profile (written into each test's folder)."""

TRAIN = '''
import sys, time
import torch
import torch.nn.functional as F
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 14
mode = sys.argv[2] if len(sys.argv) > 2 else "ok"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
for i in range(steps):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if mode == "raise" and i == 10:
        raise RuntimeError("planted failure at step 10")
    if mode == "sleep" and i >= 10:
        print("READY", flush=True)
        time.sleep(60)
print("done", flush=True)
if mode == "exit3":
    sys.exit(3)
'''

NO_TORCH = '''
import sys
print("torch imported:", "torch" in sys.modules, flush=True)
sys.exit(0 if "torch" not in sys.modules else 9)
'''

# A program that drives its own torch.profiler, as the seeds teach: a schedule, prof.step()
# every iteration and tensorboard_trace_handler writing into its own folder ("schedule"), or a
# plain `with profile()` block printing key_averages ("plain").
OWN_PROFILER = '''
import sys
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

kind = sys.argv[1]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))

def train_step():
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()

if kind == "schedule":
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                 on_trace_ready=tensorboard_trace_handler("own_logs")) as prof:
        for _ in range(8):
            train_step()
            prof.step()
else:
    for _ in range(3):
        train_step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            train_step()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=3))
print("done", flush=True)
'''

# Every way a profiled program can end (``test_run_endings.py`` on the CPU, ``tests/gpu/
# test_run_endings_gpu.py`` on a GPU): ``prog.py MODE DEVICE``. No optimizer and no steps
# unless the mode says so, so that the time window records; "READY" is printed once the
# window has had time to open, for the modes the test signals.
ENDINGS = '''
import ctypes, os, signal, sys, threading, time
import torch


class Batches(torch.utils.data.Dataset):  # at module level: spawned workers import it
    def __len__(self):
        return 100_000_000

    def __getitem__(self, i):
        return torch.full((256,), float(i % 7))


def main(mode, device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).to(device)
    x = torch.randn(64, 256, device=device)

    def work(seconds, recorded=True):
        """``seconds`` of work, inside the window when ``recorded``: first work until it records
        (starting torch.profiler on a GPU holds the program 1-3 s while CUPTI starts)."""
        t0 = time.perf_counter()
        while recorded and not torch.autograd.profiler._is_profiler_enabled and time.perf_counter() - t0 < 60:
            work(0.05, recorded=False)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            with torch.no_grad():
                model(x)
            if device == "cuda":
                torch.cuda.synchronize()

    if mode == "time_window":
        work(2.5)
    elif mode == "step_window":  # 6 optimizer steps: the window (3 skipped, 1 warm-up, 5 active) is open at exit
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        for _ in range(6):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    elif mode == "capture":  # a capture range entered and never left
        import proflab
        proflab.capture().__enter__()
        work(1.0)
    elif mode in ("own_open", "own_stopped_at_end"):
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
        prof = torch.profiler.profile(activities=acts)
        prof.start()
        work(1.0)
        if mode == "own_stopped_at_end":  # stopped and saved, then the program ends at once
            prof.stop()
            prof.export_chrome_trace("own_trace.json")
    elif mode == "thread_sys_exit":
        t = threading.Thread(target=sys.exit, args=(5,))
        t.start()
        t.join()
        work(2.5)
    elif mode == "exception":
        work(2.5)
        raise RuntimeError("planted failure inside the window")
    elif mode == "os_exit":
        work(2.5)
        sys.stdout.flush()
        os._exit(7)
    elif mode in ("sigterm", "sigint"):  # signalled once the window records
        work(1.0)
        print("READY", flush=True)
        work(120)
    elif mode.startswith("dataloader_"):  # workers alive (persistent) as the program ends
        loader = torch.utils.data.DataLoader(Batches(), batch_size=64, num_workers=2, persistent_workers=True,
                                             multiprocessing_context=mode.split("_")[1])
        global batches
        batches = iter(loader)
        work(0.0)  # until the window records
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 2.5:
            b = next(batches).to(device)
            with torch.no_grad():
                model(b)
    elif mode == "nondaemon_thread":  # the interpreter waits 2 s for it after the main thread ends
        work(2.5)
        threading.Thread(target=time.sleep, args=(2.0,), name="late-writer").start()
    elif mode == "hang_thread":  # a non-daemon thread that never ends: the program hangs at exit
        work(2.5)
        threading.Thread(target=threading.Event().wait, name="never-ends").start()
    elif mode == "hang_native":  # native code that never returns after Python's exit (argv[3]: the library)
        ctypes.CDLL(sys.argv[3])
        work(2.5)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print("program done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
'''

# A C destructor that never returns: a process that loads it hangs after Python has finished
# (what Kineto's CUPTI teardown did at exit on a GPU).
HANG_IN_DESTRUCTOR_C = '''
#include <unistd.h>
__attribute__((destructor)) static void never_returns(void) { for (;;) pause(); }
'''

# Two ranks (gloo) that all-reduce each step; rank 1 fails ("fail") or leaves cleanly
# ("early") at step 4, inside rank 0's time window: ``prog.py MODE DEVICE``.
DDP_ENDINGS = '''
import os, sys, time
import torch
import torch.distributed as dist

mode, device = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(256, 256).to(device)
x = torch.randn(64, 256, device=device)
t0 = time.perf_counter()
i = 0
while time.perf_counter() - t0 < 4.0:
    with torch.no_grad():
        y = model(x).sum().cpu()
    dist.all_reduce(y)
    i += 1
    if rank == 1 and time.perf_counter() - t0 > 2.0:
        if mode == "fail":
            raise RuntimeError("planted failure on rank 1")
        print("rank 1 leaves early", flush=True)
        sys.exit(0)
dist.destroy_process_group()
print("program done", flush=True)
'''
