"""Record the scaling study: each scenario at each GPU count, bare and under ``proflab scaling``.

    python tests/data/record/record_scaling.py --counts 1,2,4 --out DIR [--scenarios balanced,commbound,straggler]
    python tests/data/record/record_scaling.py --mode strong --global-batch 256 --scenarios commbound --out DIR

Per scenario (``scaling_job.py``; the loops are ``record_nccl.py``'s), in this order:

1. **bare**: ``torchrun --standalone --nproc_per_node N scaling_job.py`` at every count, no
   profiler anywhere: each rank's GPU-side step times (``DIR/<scenario>/bare/<N>gpu/``);
2. **proflab**: ``proflab scaling --mode weak --gpus <counts> -- torchrun ... {gpus} ...``:
   one ``proflab run`` per count (light profiler: no shapes, no stacks; the default window of
   five steps), the scaling report as JSON (``DIR/<scenario>/scaling.json``), the run
   directories (``DIR/<scenario>/runs/``) and the same GPU-side step times, taken by the
   program itself while proflab ran it (``DIR/<scenario>/profiled/<N>gpu/``).

NCCL's NVLink multicast stays off (``NCCL_NVLS_ENABLE=0``) whatever the environment says.
The per-step wall clock of each phase is printed; ``--cpu`` is a dry run over gloo. At the
end every absolute path the files hold (the output folder, the repository, the interpreter,
the site-packages folder, in run directories' JSON and in the traces' names) is made relative (``relativize``).
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def _torchrun(n: str, scenario: str, times: str, cpu: bool, global_batch: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", n,
           str(HERE / "scaling_job.py"), "--scenario", scenario, "--times", times]  # fmt: skip
    return cmd + (["--cpu"] if cpu else []) + (["--global-batch", str(global_batch)] if global_batch else [])


def _call(cmd: list[str], env: dict[str, str]) -> None:
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env)
    print(f"[{time.perf_counter() - t:6.1f} s] rc {done.returncode}: {' '.join(cmd[-8:])}", flush=True)
    if done.returncode:
        raise SystemExit(done.returncode)


def relativize(folder: Path, prefixes: dict[str, str]) -> int:
    """Replace each prefix (longest first) in every .json and .json.gz file under ``folder``;
    the number of files changed."""
    changed = 0
    order = sorted(prefixes, key=len, reverse=True)
    for path in sorted(folder.rglob("*.json*")):
        gz = path.name.endswith(".json.gz")
        if not (gz or path.name.endswith(".json")):
            continue
        raw = gzip.decompress(path.read_bytes()) if gz else path.read_bytes()
        text = raw.decode("utf-8")
        for p in order:
            text = text.replace(p, prefixes[p])
        new = text.encode("utf-8")
        if new != raw:
            path.write_bytes(gzip.compress(new, compresslevel=9, mtime=0) if gz else new)
            changed += 1
    return changed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="1,2,4")
    ap.add_argument("--scenarios", default="balanced,commbound,straggler")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--mode", choices=("weak", "strong"), default="weak")
    ap.add_argument("--global-batch", type=int, default=256, help="strong: the batch all ranks share (default 256)")
    a = ap.parse_args()
    gb = a.global_batch if a.mode == "strong" else None
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    out = Path(a.out)
    for scenario in a.scenarios.split(","):
        base = out / (scenario if a.mode == "weak" else f"{scenario}_strong")
        for n in a.counts.split(","):
            _call(_torchrun(n, scenario, str(base / "bare" / f"{n}gpu"), a.cpu, gb), env)
        cmd = [sys.executable, "-m", "proflab", "scaling", "--mode", a.mode, "--gpus", a.counts,
               "--runs-dir", str(base / "runs"), "-f", "json", "-o", str(base / "scaling.json"), "--"]  # fmt: skip
        _call(cmd + _torchrun("{gpus}", scenario, str(base / "profiled" / "{gpus}gpu"), a.cpu, gb), env)
    site = sysconfig.get_paths()["purelib"]
    n = relativize(out, {f"{out.resolve()}/": "", f"{ROOT}/": "", f'"{ROOT}"': '"."', f"{site}/": "", sys.executable: "python3"})
    print(f"absolute paths made relative in {n} files", flush=True)


if __name__ == "__main__":
    main()
