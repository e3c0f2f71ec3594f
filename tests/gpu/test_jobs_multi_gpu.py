"""Multi-GPU jobs live: ``proflab scaling --gpus 1,2 -- torchrun ...`` on a real NCCL program.

Run on a machine with two or more GPUs: ``pytest -m gpu tests/gpu/test_jobs_multi_gpu.py``
(skipped with the reason on fewer). The program is the communication-bound DDP loop of
tests/data/record/record_nccl.py (six 8192x8192 fp32 layers, batch 64 per GPU), unmodified,
under ``proflab run``: the run directories, the job report and the scaling table come from
proflab alone, and ``proflab run``'s own unprofiled step times are the ground truth.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

COMMBOUND = """
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

torch.backends.cuda.matmul.allow_tf32 = False
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
torch.manual_seed(0)
model = DDP(nn.Sequential(*[nn.Linear(8192, 8192) for _ in range(6)]).cuda())
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(64, 8192, device="cuda")
for _ in range(60):
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
dist.destroy_process_group()
"""


@pytest.fixture
def two_gpus():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {torch.cuda.device_count()}")


def test_scaling_launches_a_communication_bound_job_and_finds_it(tmp_path, two_gpus):
    (tmp_path / "prog.py").write_text(COMMBOUND)
    done = subprocess.run(
        [sys.executable, "-m", "proflab", "scaling", "--mode", "weak", "--gpus", "1,2", "--runs-dir", str(tmp_path / "runs"),
         "-f", "json", "--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "{gpus}",
         "prog.py"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    one, two = json.loads(done.stdout)["points"]
    # the unprofiled steps proflab run timed outside its window: communication-bound
    assert one["bare_step_ms"] and two["bare_step_ms"]
    assert two["bare_efficiency_pct"] < 90, (one, two)
    # the profiled efficiency of a GPU-bound loop agrees with the bare one
    assert abs(two["efficiency_pct"] - two["bare_efficiency_pct"]) <= 10, (one, two)
    assert two["exposed_comm_ms_per_step"] > 0.5 * two["loss_ms_per_step"]
    (batch,) = (tmp_path / "runs").iterdir()
    (run2,) = [p for p in batch.iterdir() if p.name.endswith("-2gpu")]
    job = subprocess.run([sys.executable, "-m", "proflab", "analyze", str(run2), "-f", "json"],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert job.returncode == 0, job.stderr[-3000:]
    d = json.loads(job.stdout)
    assert [r["rank"] for r in d["ranks"]] == [0, 1]
    assert all(r["bare_step_ms"] for r in d["ranks"])
    cb = next(f for f in d["findings"] if f["category"] == "communication_bound")
    assert cb["severity"] in ("warning", "critical")
    assert cb["evidence"]["bytes_per_step"] == 6 * (8192 * 8192 + 8192) * 4
    assert not [f for f in d["findings"] if f["id"] == "load_imbalance"]
