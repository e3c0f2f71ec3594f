"""A CPU training loop fed by a DataLoader whose samples take 2 ms each to make (decoding,
augmentation): with no workers the loop waits for every batch. To see ``proflab try`` measure
a real saving without a GPU:

    proflab run -- python examples/cpu_loader.py                          # host_bound, and its try line
    proflab try workers=2 persistent-workers -- python examples/cpu_loader.py

No proflab code in here: proflab finds the step boundaries from the optimizer, and ``try`` sets
the DataLoader's workers in the program's process.
"""

import argparse
import time

import torch
from torch import nn


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        time.sleep(0.002)  # stands for decoding and augmenting one sample
        return torch.randn(64), i % 10


if __name__ == "__main__":  # (DataLoader workers may import this module: the loop runs once)
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Samples(), batch_size=args.batch)
    it = iter(loader)
    for _ in range(args.steps):
        x, y = next(it)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
