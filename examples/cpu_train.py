"""A tiny CPU training loop (an MLP on synthetic data) to try ``proflab run`` without a GPU:

    proflab run -- python examples/cpu_train.py

No proflab code in here: proflab finds the step boundaries from the optimizer.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--batch", type=int, default=64)
args = p.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x_all = torch.randn(args.batch * 16, 256)
y_all = torch.randint(0, 10, (args.batch * 16,))

for step in range(args.steps):
    k = step % 16
    x, y = x_all[k * args.batch:(k + 1) * args.batch], y_all[k * args.batch:(k + 1) * args.batch]
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print(f"trained {args.steps} steps; final loss {loss.item():.4f}")
