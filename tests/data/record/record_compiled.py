"""Record nanoGPT compiled, as it runs, plain and under ``proflab run`` (issue 53's truth).

nanoGPT's character-level GPT (``record_gains.CharGPT``: 6 layers, 6 heads, 384 wide, block
256, batch 64, bf16 autocast, fused AdamW), its loss read every 10 iterations as nanoGPT's
``log_interval`` does, in three variants:

``eager``           the model as written
``compile``         ``torch.compile(model)`` (default mode)
``reduce-overhead`` ``torch.compile(model, mode="reduce-overhead")`` (CUDA graphs of the
                    compiled forward and backward; the optimizer, loss and batch stay eager)

Each variant runs as a program of its own (``--program VARIANT``) that times its steps on the
GPU's clock (a CUDA event on the current stream at each step's end, no profiler: what
``proflab run`` measures for its unprofiled steps), and prints one JSON line: the median step
after warm-up, Dynamo's counters, and nanoGPT's own MFU formula for that step. The driver runs
each variant plain, then under ``proflab run`` (default options), and once more plain, and
writes ``compiled.json`` (the plain medians, proflab's unprofiled median and its recorded
FLOPs and compile record) and each proflab run's trace and process record
(``nanogpt.<variant>.pt.trace.json.gz``, ``nanogpt.<variant>.process.json``) into ``--out``.

``--ab N`` then runs each variant plain and under ``proflab run`` alternately N times more
(plain, proflab, plain, proflab...) and writes ``ab.json``: the two sides' medians, so that the
claim "the bare step under proflab equals the plain run's" is judged against the run-to-run
spread of the plain runs themselves.

Usage::

    python tests/data/record/record_compiled.py --out DIR [--steps N] [--only VARIANT ...] [--ab N] [--no-record]
    python tests/data/record/record_compiled.py --program compile --steps 60    # one plain run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ("eager", "compile", "reduce-overhead")
WARMUP = 15  # steps left out of a program's own median (compilation, CUDA graph recording)


def program(variant: str, steps: int) -> dict:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(HERE))
    from record_gains import CharGPT

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    small = {} if dev == "cuda" else dict(d=64, layers=2, heads=4, block=32)
    batch = 64 if dev == "cuda" else 4
    torch.manual_seed(0)
    model = CharGPT(**small).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=dev == "cuda")
    fwd = model if variant == "eager" else torch.compile(model, **({"mode": variant} if variant != "compile" else {}))
    block = model.cfg["block"]
    data = torch.randint(0, 65, (8, batch, block + 1), device=dev)
    times, last = [], None
    for i in range(steps):
        tok = data[i % 8]
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            logits = fwd(tok[:, :-1])
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), tok[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i % 10 == 0:
            print(f"iter {i}: loss {loss.item():.4f}", file=sys.stderr)
        if dev == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            if last is not None:
                times.append((last, ev))
            last = ev
    if dev == "cuda":
        torch.cuda.synchronize()
        ms = [a.elapsed_time(b) for a, b in times]
    else:
        ms = []
    counters = {}
    if "torch._dynamo.utils" in sys.modules:
        du = sys.modules["torch._dynamo.utils"]
        counters = {k: {str(a): int(b) for a, b in v.items()} for k, v in du.counters.items()
                    if k in ("frames", "stats", "graph_break", "recompiles", "inductor")}
    bare = ms[WARMUP:]
    med = statistics.median(bare) if bare else None
    flops = model.mfu_flops_per_iter(batch)
    return {
        "variant": variant,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "steps_ms": [round(x, 4) for x in bare],
        "median_ms": None if med is None else round(med, 4),
        "counters": counters,
        "nanogpt_flops_per_iter": flops,
        # nanoGPT's estimate_mfu against its A100 figure is not used: the step's achieved FLOP/s
        "nanogpt_tflops": None if not med else round(flops / (med / 1e3) / 1e12, 3),
    }


def _plain(variant: str, steps: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--program", variant, "--steps", str(steps)],
                         capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _under_proflab(variant: str, steps: int, runs: Path) -> tuple[dict, Path]:
    before = set(runs.iterdir()) if runs.exists() else set()
    out = subprocess.run([sys.executable, "-m", "proflab", "run", "--no-analyze", "-o", str(runs), "--name", variant, "--",
                          sys.executable, __file__, "--program", variant, "--steps", str(steps)],
                         capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(out.stdout[-2000:] + out.stderr[-2000:])
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    (run,) = set(runs.iterdir()) - before
    sys.stderr.write(out.stdout[-1500:])
    return json.loads(lines[-1]), run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--program", choices=VARIANTS)
    ap.add_argument("--ab", type=int, default=0, help="alternate plain and proflab runs N times more per variant")
    ap.add_argument("--no-record", action="store_true", help="only the --ab runs")
    a = ap.parse_args(argv)
    if a.program:
        print(json.dumps(program(a.program, a.steps)), flush=True)
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = out / "runs"
    result = {"recorded_with": {"steps": a.steps, "warmup": WARMUP, "python": sys.version.split()[0]}, "variants": {}}
    for v in (a.only or VARIANTS) if not a.no_record else ():
        t0 = time.perf_counter()
        first = _plain(v, a.steps)
        prof, run = _under_proflab(v, a.steps, runs)
        again = _plain(v, a.steps)
        (proc,) = [json.loads(p.read_text()) for p in (run / "processes").glob("*.json")
                   if json.loads(p.read_text()).get("traces")]
        (trace,) = (run / "traces").glob("*.pt.trace.json.gz")
        shutil.copy(trace, out / f"nanogpt.{v}.pt.trace.json.gz")
        (out / f"nanogpt.{v}.process.json").write_text(json.dumps(proc, indent=1))
        result["variants"][v] = {
            "plain": [first, again],
            "plain_median_ms": [first["median_ms"], again["median_ms"]],
            "program_median_under_proflab_ms": prof["median_ms"],
            "proflab_bare": proc["step_times"],
            "proflab_flops": proc.get("flops"),
            "proflab_compile": proc.get("compile"),
            "counters_plain": first["counters"],
            "counters_under_proflab": prof["counters"],
            "wall_s": round(time.perf_counter() - t0, 1),
        }
        (out / "compiled.json").write_text(json.dumps(result, indent=1))
        print(v, json.dumps({k: result["variants"][v][k] for k in ("plain_median_ms", "program_median_under_proflab_ms", "wall_s")}),
              "proflab bare", proc["step_times"].get("bare_ms"), proc["step_times"].get("clock"), flush=True)
    if a.ab:
        ab = {}
        for v in a.only or VARIANTS:
            plain, prof, bare = [], [], []
            for _ in range(a.ab):
                plain.append(_plain(v, a.steps)["median_ms"])
                p, run = _under_proflab(v, a.steps, runs)
                prof.append(p["median_ms"])
                (proc,) = [json.loads(q.read_text()) for q in (run / "processes").glob("*.json")
                           if json.loads(q.read_text()).get("traces")]
                bare.append(proc["step_times"].get("bare_ms"))
            ab[v] = {"plain_ms": plain, "under_proflab_program_ms": prof, "under_proflab_bare_ms": bare,
                     "plain_median_ms": statistics.median(plain), "under_proflab_median_ms": statistics.median(bare)}
            print("ab", v, json.dumps(ab[v]), flush=True)
            (out / "ab.json").write_text(json.dumps(ab, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
