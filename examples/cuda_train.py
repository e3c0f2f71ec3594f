"""A small CUDA training loop (an MLP, AdamW) for ``proflab run`` on a GPU:

    proflab run -- python examples/cuda_train.py

No proflab code in here: the step window comes from the optimizer's steps.
"""

import torch
from torch import nn

model = nn.Sequential(nn.Linear(2048, 4096), nn.GELU(), nn.Linear(4096, 2048)).cuda()
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(256, 2048, device="cuda")
for step in range(40):
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print(f"trained 40 steps; final loss {loss.item():.4f}")
