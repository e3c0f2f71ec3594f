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
