"""Record a small CPU-only torch.profiler trace with whatever PyTorch this interpreter has.

    python tests/data/compat/record_cpu.py OUT.pt.trace.json.gz

A two-layer MLP trained for 3 profiled steps (schedule wait=1, warmup=1, active=3) with
record_shapes, written by tensorboard_trace_handler(use_gzip=True) and renamed to OUT. Used
to add one trace per PyTorch version to the conformance corpus (see README.md here).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def main(out: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    with tempfile.TemporaryDirectory() as tmp:
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=1, warmup=1, active=3),
            record_shapes=True,
            on_trace_ready=tensorboard_trace_handler(tmp, use_gzip=True),
        ) as prof:
            for _ in range(5):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                prof.step()
        (made,) = Path(tmp).glob("*.pt.trace.json.gz")
        shutil.copyfile(made, out)
    print(f"{out}: torch {torch.__version__}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
