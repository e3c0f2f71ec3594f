"""A small data-parallel training loop (DDP over NCCL, one process per GPU):

    proflab run -- torchrun --nproc_per_node 2 examples/ddp_train.py

No proflab code in here: every rank writes its own trace (``rank<R>_<pid>``), its step
window taken from its optimizer's steps. The model is large enough that gradient all-reduces
show, small enough to run in seconds.
"""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
torch.manual_seed(rank)
model = DDP(nn.Sequential(nn.Linear(4096, 8192), nn.GELU(), nn.Linear(8192, 4096)).cuda(), device_ids=[local])
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(512, 4096, device="cuda")
for step in range(30):
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
if rank == 0:
    print(f"trained 30 steps on {dist.get_world_size()} ranks; final loss {loss.item():.4f}")
dist.destroy_process_group()
