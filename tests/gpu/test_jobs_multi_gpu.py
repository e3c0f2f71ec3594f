"""Multi-GPU jobs live: ``proflab scaling --gpus 1,2[,4] -- torchrun ...`` on a real NCCL program.

Run on a machine with two or more GPUs (four add the 4-GPU point): ``pytest -m gpu tests/gpu/test_jobs_multi_gpu.py``
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
    import torch

    counts = [1, 2, 4] if torch.cuda.device_count() >= 4 else [1, 2]
    (tmp_path / "prog.py").write_text(COMMBOUND)
    done = subprocess.run(
        [sys.executable, "-m", "proflab", "scaling", "--mode", "weak", "--gpus", ",".join(map(str, counts)),
         "--runs-dir", str(tmp_path / "runs"), "-f", "json", "--", sys.executable, "-m", "torch.distributed.run",
         "--standalone", "--nproc_per_node", "{gpus}", "prog.py"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    points = json.loads(done.stdout)["points"]
    assert [p["gpus"] for p in points] == counts
    for one, more in zip(points, points[1:]):
        # the unprofiled steps proflab run timed (GPU-side) outside its window: communication-bound
        assert one["bare_step_ms"] and more["bare_step_ms"]
        assert more["bare_efficiency_pct"] < 90, points
        assert more["bare_efficiency_pct"] <= one["bare_efficiency_pct"] + 2, points  # no better with more GPUs
        # the profiled efficiency of a GPU-bound loop agrees with the bare one
        assert abs(more["efficiency_pct"] - more["bare_efficiency_pct"]) <= 10, points
        assert more["exposed_comm_ms_per_step"] > 0.5 * more["loss_ms_per_step"]
    (batch,) = (tmp_path / "runs").iterdir()
    for n in counts[1:]:
        (run,) = [p for p in batch.iterdir() if p.name.endswith(f"-{n}gpu")]
        job = subprocess.run([sys.executable, "-m", "proflab", "analyze", str(run), "-f", "json"],
                             capture_output=True, text=True, timeout=600)  # fmt: skip
        assert job.returncode == 0, job.stderr[-3000:]
        d = json.loads(job.stdout)
        assert [r["rank"] for r in d["ranks"]] == list(range(n))
        assert all(r["bare_step_ms"] for r in d["ranks"])
        cb = next(f for f in d["findings"] if f["category"] == "communication_bound")
        assert cb["severity"] in ("warning", "critical")
        assert cb["evidence"]["bytes_per_step"] == 6 * (8192 * 8192 + 8192) * 4
        # no straggler worth a warning: a lead of ~1% of the step (launch jitter) may get an info
        assert not [f for f in d["findings"] if f["id"] == "load_imbalance" and f["severity"] != "info"], d["findings"]
