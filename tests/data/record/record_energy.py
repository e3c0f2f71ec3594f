"""Workloads of known cost for the energy tests (tests/data/energy/), on one GPU.

    gemm      each step: 150 x torch.mm of two 8192x8192 bf16 matrices (2*8192**3 FLOP each)
    membound  each step: 300 x torch.add of two 2**28-element fp32 tensors (3 GiB moved each)
    idle      each step: one tiny kernel, then 0.25 s asleep (the GPU idles)

Each step ends with torch.cuda.synchronize() and proflab.step() (a no-op outside proflab).
Recorded on the GPU machine from the repository root, with the shapes recorded so the GEMM
FLOPs come from the trace:

    proflab run -o RUNS --name energy_gemm --record-shapes --wait 3 --warmup 1 --active 12 \\
        -- python tests/data/record/record_energy.py gemm

``--bare`` runs the same steps without proflab's runtime and prints the unprofiled step time
and, from proflab.measure_energy around the timed steps, the energy and TFLOPS/W as JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

N = 8192
GEMMS_PER_STEP = 150
ADD_ELEMS = 1 << 28
ADDS_PER_STEP = 300
FLOP_PER_STEP = {"gemm": 2 * N**3 * GEMMS_PER_STEP, "membound": None, "idle": None}


def make_step(kind: str):
    if kind == "gemm":
        a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
        c = torch.empty_like(a)

        def step():
            for _ in range(GEMMS_PER_STEP):
                torch.mm(a, b, out=c)
    elif kind == "membound":
        x = torch.randn(ADD_ELEMS, device="cuda")
        y = torch.randn(ADD_ELEMS, device="cuda")
        z = torch.empty_like(x)

        def step():
            for _ in range(ADDS_PER_STEP):
                torch.add(x, y, out=z)
    else:
        t = torch.zeros(16, device="cuda")

        def step():
            t.add_(1)
            time.sleep(0.25)
    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=sorted(FLOP_PER_STEP))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--bare", action="store_true", help="time (and measure the energy of) the steps without proflab run")
    args = ap.parse_args()
    step = make_step(args.kind)
    step()
    torch.cuda.synchronize()
    if args.bare:
        import proflab

        with proflab.measure_energy(devices=[0]) as m:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        e = m.result.energy_j[0] if m.result.energy_j else None
        fl = FLOP_PER_STEP[args.kind]
        print(json.dumps({"kind": args.kind, "steps": args.steps, "step_ms": dt / args.steps * 1e3,
                          "energy_j": e, "energy_per_step_j": None if e is None else e / args.steps,
                          "flop_per_step": fl, "tflops": None if fl is None else fl * args.steps / dt / 1e12,
                          "tflops_per_w": None if fl is None or e is None else fl * args.steps / e / 1e12}))
        return
    import proflab

    for _ in range(args.steps):
        step()
        torch.cuda.synchronize()
        proflab.step()


if __name__ == "__main__":
    main()
