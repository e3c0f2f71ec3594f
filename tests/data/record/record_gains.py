"""Record the gain-truth set: programs with one fixable problem each, the fix made for real,
and the bare saving measured, beside a torch.profiler trace of the program before the fix.

A finding's gain is a prediction of the bare step time its fix saves; this set is what the
predictions are checked against (``tests/test_gains_truth.py``, benchmarks/README.md's table).
For every program below, in one process on one GPU:

``bare``     each variant (the program as written, and with each fix) is built, warmed up, then
             timed in interleaved blocks (base, fix, base, fix, ...): GPU-side step times, CUDA
             events on the current stream at each step's end, as ``proflab run`` measures
             unprofiled steps. The measured gain is the difference of the medians, with a 95 %
             bootstrap interval (steps resampled within each variant).
``traces``   each variant under torch.profiler as ``proflab run`` records by default (CPU + CUDA
             activities, no shapes, no stacks; schedule wait 2, warm-up 2, active 4):
             ``<program>.<variant>.pt.trace.json.gz``; the ``--flops`` programs also with
             ``record_shapes`` (``<program>.base.shapes.pt.trace.json.gz``) and the FLOPs of one
             step by operator from ``torch.utils.flop_counter``.

A fix set by the environment (the allocator's expandable segments) runs each variant in a
process of its own, alternated (base, fix, base, fix).

Programs (each a loop a user would write; sizes for an H100/H200):

gpt_char        nanoGPT's character-level GPT (6 layers, 6 heads, 384 wide, block 256, batch 64,
                vocab 65, 10.7 M parameters), bf16 autocast, fused AdamW, eager, printing
                ``loss.item()`` every iteration. Fixes: ``noitem`` (the loss read every 1000
                iterations: no per-step sync) and ``compile`` (torch.compile, the print kept).
nanogpt         the same GPT as nanoGPT's train.py runs it: the loss read every 10 iterations
                (log_interval). Fixes: ``compile`` (torch.compile(model), default mode) and
                ``graphs`` (torch.compile(model, mode="reduce-overhead"): CUDA graphs of the
                compiled forward and backward; the optimizer and loss stay eager).
lm_sync         a GPU-bound transformer LM (8 layers, 768 wide, seq 512, batch 24, bf16) that
                each step reads the loss, synchronises and spends ~3 ms formatting a log line.
                Fix ``nosync``: the loss read and logged every 20 steps.
cnn_loader      a small CNN fed by a DataLoader with numpy preprocessing per sample, num_workers=0.
                Fix ``workers``: num_workers=6, pin_memory, persistent workers, prefetch 4.
pageable_h2d    each step copies a 256 MiB batch from pageable host memory, then 4 bf16 GEMMs.
                Fix ``pinned``: the batch in pinned memory, copied with non_blocking=True.
tf32_mlp        an fp32 MLP (8 x 4096, batch 4096) with TF32 off. Fix ``tf32``: TF32 matmuls.
amp_lm          the LM in fp32 (TF32 on). Fix ``bf16``: bf16 autocast.
foreach_adam    a 24-layer 256-wide MLP, AdamW(foreach=False): a kernel per parameter per
                update. Fix ``fused``: AdamW(fused=True).
graph_mlp       an 8-layer 1024-wide MLP, batch 64, Adam(capturable): thousands of microsecond
                kernels. Fix ``graph``: the whole step captured in one CUDA graph and replayed.
host_busy       20 ms of the program's own Python per step, a 16 MiB pageable copy, then 10
                fp32 4096² GEMMs (TF32). Fix ``offloaded``: that work moved off the loop (to a
                worker), so the loop no longer does it.
alloc_frag      a loop whose tensors vary in size step to step under a 24 GiB memory cap, so the
                caching allocator frees and re-allocates its segments. Fix ``expandable``:
                ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (a process each).

Usage::

    python tests/data/record/record_gains.py --out DIR [--only NAME ...]
    python tests/data/record/record_gains.py --out DIR --dry-run     # CPU, tiny sizes
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TEARDOWN_CUPTI", "1")  # windows separated by bare steps: each teardown completes
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from record_kineto import _finalize  # noqa: E402
from record_realistic import LM, _Images, _log_line  # noqa: E402

DEV = "cuda"
SMALL = False  # --dry-run
WAIT, WARMUP, ACTIVE = 2, 2, 4
ROUNDS = 3  # interleaved blocks per variant
BLOCK_S = 0.6  # each block lasts about this long (and 10 to 60 steps)


class Program:
    """A program and its fixes: ``build(variant) -> step(i)``."""

    def __init__(self, build, variants, *, category, fix, knob=None, flops=False, env=None, no_steps_trace=False):
        self.build, self.variants = build, variants
        self.category, self.fix, self.knob = category, fix, knob
        self.flops, self.env, self.no_steps_trace = flops, env, no_steps_trace


# ------------------------------------------------------------------------------------------
# programs
# ------------------------------------------------------------------------------------------

class _Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.attn(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class CharGPT(nn.Module):
    """nanoGPT's model (no dropout), shakespeare-char sizes."""

    def __init__(self, vocab=65, d=384, layers=6, heads=6, block=256):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.h = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT
        self.cfg = dict(vocab=vocab, d=d, layers=layers, heads=heads, block=block)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.h:
            x = blk(x)
        return self.lm_head(self.ln_f(x))

    def mfu_flops_per_iter(self, batch: int) -> float:
        """nanoGPT's estimate_mfu: 6N + 12 L H Q T FLOPs per token (N without the position
        embedding), times the tokens of one iteration."""
        c = self.cfg
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        per_token = 6 * n + 12 * c["layers"] * c["heads"] * (c["d"] // c["heads"]) * c["block"]
        return per_token * c["block"] * batch


def _gpt_char(variant, *, every=None):
    small = dict(d=64, layers=2, heads=4, block=32) if SMALL else {}
    batch = 4 if SMALL else 64
    model = CharGPT(**small).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=DEV == "cuda")
    fwd = (torch.compile(model) if variant == "compile" else
           torch.compile(model, mode="reduce-overhead") if variant == "graphs" else model)
    block = model.cfg["block"]
    data = torch.randint(0, 65, (8, batch, block + 1), device=DEV)
    log = open(os.devnull, "w")
    every = every or (1000 if variant == "noitem" else 1)

    def step(i):
        tok = data[i % 8]
        with torch.autocast(DEV, dtype=torch.bfloat16, enabled=DEV == "cuda"):
            logits = fwd(tok[:, :-1])
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), tok[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i % every == 0:
            print(f"iter {i}: loss {loss.item():.4f}", file=log)

    step.mfu_flops_per_iter = model.mfu_flops_per_iter(batch)
    return step


def _lm(variant, *, fp32=False, autocast=True, drain=False):
    torch.backends.cuda.matmul.allow_tf32 = True
    vocab, seq, batch = (512, 32, 2) if SMALL else (16384, 512, 24)
    model = LM(vocab=vocab, seq=seq, **(dict(d=64, heads=4, layers=2) if SMALL else {})).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=DEV == "cuda")
    data = torch.randint(0, vocab, (8, batch, seq + 1), device=DEV)
    losses = []

    def step(i):
        tok = data[i % 8]
        with torch.autocast(DEV, dtype=torch.bfloat16, enabled=autocast and DEV == "cuda"):
            logits = model(tok[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, vocab), tok[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if drain or i % 20 == 19:
            losses.append(loss.item())
            if drain and DEV == "cuda":
                torch.cuda.synchronize()
            _log_line(i, losses)

    return step


def _cnn_loader(variant):
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(128, 256, 3, padding=1), nn.BatchNorm2d(256), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(256, 10),
    ).to(DEV, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    kw = dict(num_workers=6, pin_memory=DEV == "cuda", persistent_workers=True, prefetch_factor=4) if variant == "workers" else {}
    loader = torch.utils.data.DataLoader(_Images(n=100_000), batch_size=32, shuffle=True, **kw)
    it = iter(loader)

    def step(i):
        x, y = next(it)
        x, y = x.to(DEV, non_blocking=True), y.to(DEV, non_blocking=True)
        with torch.autocast(DEV, dtype=torch.bfloat16, enabled=DEV == "cuda"):
            loss = F.cross_entropy(model(x.contiguous(memory_format=torch.channels_last)), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _pageable_h2d(variant):
    n, width = (1 << 14, 64) if SMALL else (1 << 26, 8192)  # 256 MiB of float32
    host = torch.randn(n)
    if variant == "pinned" and DEV == "cuda":
        host = host.pin_memory()
    w = [torch.randn(width, width, device=DEV, dtype=torch.bfloat16) * 0.01 for _ in range(4)]

    def step(i):
        x = host.to(DEV, non_blocking=variant == "pinned")
        h = x[: width * width].view(width, width).to(torch.bfloat16)
        for m in w:
            h = torch.relu(h @ m)

    return step


def _tf32_mlp(variant):
    width, batch, layers = (64, 32, 2) if SMALL else (4096, 4096, 8)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())]).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    xs = torch.randn(4, batch, width, device=DEV)
    tf32 = variant == "tf32"

    def step(i):
        torch.backends.cuda.matmul.allow_tf32 = tf32  # both variants live in one process
        loss = model(xs[i % 4]).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _foreach_adam(variant):
    width, layers, batch = 256, 24, 64
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.GELU())]).to(DEV)
    kw = dict(fused=True) if variant == "fused" and DEV == "cuda" else dict(foreach=variant == "fused")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)
    xs = torch.randn(8, batch, width, device=DEV)

    def step(i):
        loss = model(xs[i % 8]).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _graph_mlp(variant):
    width, layers, batch = (64, 2, 8) if SMALL else (1024, 8, 64)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())]).to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=DEV == "cuda")
    xs = torch.randn(8, batch, width, device=DEV)
    ys = torch.randn(8, batch, width, device=DEV)
    if variant != "graph" or DEV != "cuda":

        def step(i):
            loss = F.mse_loss(model(xs[i % 8]), ys[i % 8])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step
    sx, sy = xs[0].clone(), ys[0].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(sx), sy).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        F.mse_loss(model(sx), sy).backward()
        opt.step()

    def step(i):
        sx.copy_(xs[i % 8])
        sy.copy_(ys[i % 8])
        graph.replay()

    return step


def _busy_python(seconds: float) -> int:
    """The program's own Python for ``seconds``: arithmetic on lists, nothing the profiler records."""
    t_end = time.perf_counter() + seconds
    acc = 0
    while time.perf_counter() < t_end:
        acc += sum(i * i for i in range(2000)) % 7
    return acc


def _host_busy(variant):
    width = 64 if SMALL else 4096
    host = torch.randn(4 << 20)  # 16 MiB, pageable
    w = [torch.randn(width, width, device=DEV) * 0.01 for _ in range(10)]
    torch.backends.cuda.matmul.allow_tf32 = True

    def step(i):
        if variant == "base":
            _busy_python(0.002 if SMALL else 0.020)
        x = host.to(DEV)
        h = x.view(-1, width)  # 1024 x 4096
        for m in w:
            h = torch.relu(h @ m)

    return step


def _alloc_frag(variant):
    """Sizes that change step to step under a memory cap: the caching allocator cannot reuse
    its segments for the next step's sizes, frees them (synchronising) and allocates anew."""
    if DEV == "cuda" and not SMALL:
        torch.cuda.set_per_process_memory_fraction(24 * 2**30 / torch.cuda.get_device_properties(0).total_memory)
    unit = 1 << 12 if SMALL else 1 << 26  # float32 elements: 256 MiB
    sizes = [3, 5, 2, 7, 4, 6, 1, 8]
    keep = []

    def step(i):
        k = sizes[i % len(sizes)]
        ts = [torch.empty(int(unit * (k + j * 0.37)), device=DEV) for j in range(6)]
        for t in ts:
            t.fill_(1.0)
        keep.append(ts[::2])  # a third of them live into the next step
        del keep[:-1]
        torch.stack([t[:1024].sum() for t in ts]).sum()

    return step


PROGRAMS = {
    "gpt_char": Program(_gpt_char, ("base", "noitem", "compile"), category="sync_bound+launch_bound",
                        fix={"noitem": "read the loss every 1000 iterations (no .item() per step)",
                             "compile": "torch.compile(model) (fusion), the per-step print kept"},
                        flops=True),
    "nanogpt": Program(lambda v: _gpt_char(v, every=10), ("base", "compile", "graphs"), category="launch_bound",
                       fix={"compile": "torch.compile(model) (default mode)",
                            "graphs": "torch.compile(model, mode='reduce-overhead')"}),
    "lm_sync": Program(lambda v: _lm(v, drain=v == "base"), ("base", "nosync"), category="sync_bound",
                       fix={"nosync": "read and log the loss every 20 steps, no synchronize"}),
    "cnn_loader": Program(_cnn_loader, ("base", "workers"), category="host_bound",
                          fix={"workers": "DataLoader(num_workers=6, pin_memory=True, persistent_workers=True, prefetch_factor=4)"},
                          knob="workers", flops=True),
    "pageable_h2d": Program(_pageable_h2d, ("base", "pinned"), category="pageable_memcpy",
                            fix={"pinned": "the batch in pinned memory, .to(device, non_blocking=True)"}, knob="pin_memory"),
    "tf32_mlp": Program(_tf32_mlp, ("base", "tf32"), category="tensor_cores_unused",
                        fix={"tf32": "torch.backends.cuda.matmul.allow_tf32 = True"}, knob="tf32", flops=True),
    "amp_lm": Program(lambda v: _lm(v, autocast=v == "bf16"), ("base", "bf16"), category="tensor_cores_unused",
                      fix={"bf16": "torch.autocast('cuda', dtype=torch.bfloat16) around forward and loss"}),
    "foreach_adam": Program(_foreach_adam, ("base", "fused"), category="launch_bound",
                            fix={"fused": "AdamW(fused=True)"}, knob="fused_optimizer"),
    "graph_mlp": Program(_graph_mlp, ("base", "graph"), category="launch_bound",
                         fix={"graph": "the whole step captured in a CUDA graph and replayed"}),
    "host_busy": Program(_host_busy, ("base", "offloaded"), category="host_bound",
                         fix={"offloaded": "the 20 ms of Python moved off the training loop"}, no_steps_trace=True),
    "alloc_frag": Program(_alloc_frag, ("base", "expandable"), category="memory_fragmentation",
                          fix={"expandable": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"}, knob="expandable_segments",
                          env={"expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}),
}


# ------------------------------------------------------------------------------------------
# measurement
# ------------------------------------------------------------------------------------------

def _sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def gpu_steps(step, first: int, n: int) -> list[float]:
    """GPU-side step times (ms): a CUDA event on the current stream at each step's end."""
    if DEV != "cuda":
        out, t = [], time.perf_counter()
        for k in range(n):
            step(first + k)
            now = time.perf_counter()
            out.append((now - t) * 1e3)
            t = now
        return out
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    ev[0].record()
    for k in range(n):
        step(first + k)
        ev[k + 1].record()
    torch.cuda.synchronize()
    return [ev[k].elapsed_time(ev[k + 1]) for k in range(n)]


def _block_steps(step, first: int) -> int:
    t = statistics.median(gpu_steps(step, first, 3))
    return int(min(60, max(10, math.ceil(BLOCK_S * 1e3 / max(t, 1e-3))))) if not SMALL else 3


def interval(a: list[float], b: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap interval of median(a) - median(b) (steps resampled within each side)."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(a), np.asarray(b)
    d = np.median(rng.choice(a, (n, a.size)), axis=1) - np.median(rng.choice(b, (n, b.size)), axis=1)
    return float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))


def trace_of(step, first: int, out: Path, name: str, *, shapes=False, steps=True) -> dict:
    """One torch.profiler window of ``step`` as ``proflab run`` records it; the trace file."""
    tmp = tempfile.mkdtemp(prefix="gains_")
    raw = os.path.join(tmp, "trace.json")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
    _sync()
    t0 = time.perf_counter()
    if steps:
        with profile(activities=acts, schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE), record_shapes=shapes,
                     on_trace_ready=lambda p: p.export_chrome_trace(raw)) as prof:
            for k in range(WAIT + WARMUP + ACTIVE):
                step(first + k)
                prof.step()
    else:  # a plain `with profile()` block around a few iterations: no ProfilerStep ranges
        with profile(activities=acts, record_shapes=shapes) as prof:
            for k in range(ACTIVE + 2):
                step(first + k)
            _sync()
        prof.export_chrome_trace(raw)
    _sync()
    dst = out / name
    _finalize(raw, str(dst), host_name="gpu-host")
    return {"trace": dst.name, "bytes": dst.stat().st_size, "wall_s": round(time.perf_counter() - t0, 2)}


def flop_counts(step, first: int) -> dict:
    """torch.utils.flop_counter's FLOPs of one step, by operator (the step run once under it)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        step(first)
    _sync()
    per_op = {str(op): int(n) for op, n in fc.get_flop_counts().get("Global", {}).items()}
    return {"total": int(fc.get_total_flops()), "by_op": dict(sorted(per_op.items(), key=lambda kv: -kv[1]))}


def measure(name: str, out: Path) -> dict:
    prog = PROGRAMS[name]
    torch.manual_seed(0)
    t0 = time.perf_counter()
    steps = {}
    for v in prog.variants:
        steps[v] = prog.build(v)
        for k in range(5):  # warm-up: compilation, autotuning, allocator, cuBLAS handles
            steps[v](k)
        _sync()
    rec = {"category": prog.category, "fix": prog.fix, "knob": prog.knob, "setup_s": round(time.perf_counter() - t0, 1)}
    i = 100
    n = _block_steps(steps["base"], i)
    times = {v: [] for v in prog.variants}
    blocks = {v: [] for v in prog.variants}
    for _ in range(ROUNDS):
        for v in prog.variants:
            t = gpu_steps(steps[v], i, n)
            i += n
            times[v] += t
            blocks[v].append(round(statistics.median(t), 4))
    rec["bare"] = {v: {"gpu_step_ms": [round(x, 4) for x in times[v]], "median_ms": round(statistics.median(times[v]), 4),
                       "block_medians_ms": blocks[v]} for v in prog.variants}  # fmt: skip
    base = times["base"]
    rec["measured"] = {}
    for v in prog.variants[1:]:
        lo, hi = interval(base, times[v])
        g = statistics.median(base) - statistics.median(times[v])
        rec["measured"][v] = {"gain_ms": round(g, 4), "gain_pct": round(100 * g / statistics.median(base), 2),
                              "ci95_ms": [round(lo, 4), round(hi, 4)]}  # fmt: skip
    rec["traces"] = {}
    for v in prog.variants:
        rec["traces"][v] = trace_of(steps[v], i, out, f"{name}.{v}.pt.trace.json.gz")
        i += WAIT + WARMUP + ACTIVE
    if prog.no_steps_trace:
        rec["traces"]["base_no_steps"] = trace_of(steps["base"], i, out, f"{name}.base.nosteps.pt.trace.json.gz", steps=False)
        i += ACTIVE + 2
    if prog.flops:
        rec["traces"]["base_shapes"] = trace_of(steps["base"], i, out, f"{name}.base.shapes.pt.trace.json.gz", shapes=True)
        i += WAIT + WARMUP + ACTIVE
        rec["flops"] = flop_counts(steps["base"], i)
        i += 1
        mfu = getattr(steps["base"], "mfu_flops_per_iter", None)
        if mfu:
            rec["flops"]["script_formula_per_iter"] = mfu
    after = gpu_steps(steps["base"], i, n)
    rec["bare_after"] = {"median_ms": round(statistics.median(after), 4)}
    return rec


def measure_in_processes(name: str, out: Path, script: str) -> dict:
    """Each variant in a process of its own (its fix is the environment), alternated."""
    prog = PROGRAMS[name]
    rec = {"category": prog.category, "fix": prog.fix, "knob": prog.knob, "processes": []}
    times = {v: [] for v in prog.variants}
    for r in range(2):
        for v in prog.variants:
            env = {**os.environ, **(prog.env or {}).get(v, {})}
            argv = [sys.executable, script, "--child", name, "--variant", v, "--out", str(out)]
            argv += ["--trace"] if r == 0 else []
            argv += ["--dry-run"] if SMALL else []
            p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
            try:
                got = json.loads(p.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                got = {"error": p.stderr[-2000:]}
            rec["processes"].append({"variant": v, **got})
            times[v] += got.get("gpu_step_ms", [])
    rec["bare"] = {v: {"gpu_step_ms": [round(x, 4) for x in t], "median_ms": round(statistics.median(t), 4) if t else None}
                   for v, t in times.items()}  # fmt: skip
    rec["measured"] = {}
    base = times["base"]
    for v in prog.variants[1:]:
        if base and times[v]:
            lo, hi = interval(base, times[v])
            g = statistics.median(base) - statistics.median(times[v])
            rec["measured"][v] = {"gain_ms": round(g, 4), "gain_pct": round(100 * g / statistics.median(base), 2),
                                  "ci95_ms": [round(lo, 4), round(hi, 4)]}  # fmt: skip
    rec["traces"] = {v: {"trace": f"{name}.{v}.pt.trace.json.gz"} for v in prog.variants}
    return rec


def child(name: str, variant: str, out: Path, trace: bool) -> dict:
    torch.manual_seed(0)
    step = PROGRAMS[name].build(variant)
    for k in range(5):
        step(k)
    _sync()
    n = _block_steps(step, 10)
    t = gpu_steps(step, 20, 2 * n)
    rec = {"gpu_step_ms": t, "median_ms": statistics.median(t)}
    if trace:
        rec["trace"] = trace_of(step, 20 + 2 * n, out, f"{name}.{variant}.pt.trace.json.gz")
    if DEV == "cuda":
        rec["num_alloc_retries"] = torch.cuda.memory_stats().get("num_alloc_retries")
        rec["reserved_bytes"] = torch.cuda.memory_reserved()
    return rec


def _dry_run() -> None:
    global DEV, SMALL, WAIT, WARMUP, ACTIVE, ROUNDS
    DEV, SMALL, WAIT, WARMUP, ACTIVE, ROUNDS = "cpu", True, 1, 1, 2, 2
    PROGRAMS.pop("graph_mlp", None)  # CUDA graphs need CUDA
    PROGRAMS["gpt_char"].variants = ("base", "noitem")  # torch.compile takes minutes on a CPU
    PROGRAMS.pop("nanogpt", None)  # (gpt_char without its compiled variants, and CUDA graphs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: checks the script, measures nothing")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--steps-only", type=int, help=argparse.SUPPRESS)  # --child: just run N steps (under ncu)
    args = ap.parse_args(argv)
    if args.dry_run:
        _dry_run()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child and args.steps_only:
        step = PROGRAMS[args.child].build(args.variant)
        for k in range(args.steps_only):
            step(k)
        _sync()
        return 0
    if args.child:
        print(json.dumps(child(args.child, args.variant, out, args.trace)), flush=True)
        return 0
    truth_path = out / "truth.json"
    truth = json.loads(truth_path.read_text()) if truth_path.exists() else {"programs": {}}
    truth["recorded_with"] = {
        "gpu": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu (dry run)",
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE}, "rounds": ROUNDS,
    }  # fmt: skip
    for name in args.only or list(PROGRAMS):
        t0 = time.perf_counter()
        try:
            if PROGRAMS[name].env:
                truth["programs"][name] = measure_in_processes(name, out, os.path.abspath(__file__))
            else:
                truth["programs"][name] = measure(name, out)
        except Exception as e:  # one program failing must not lose the others
            import traceback

            truth["programs"][name] = {"error": f"{type(e).__name__}: {e}", "where": traceback.format_exc()[-1500:]}
        r = truth["programs"][name]
        med = {v: b.get("median_ms") for v, b in r.get("bare", {}).items()}
        print(f"{name}: bare {med} measured {r.get('measured')} {time.perf_counter() - t0:.0f} s"
              + (f" ERROR {r['error']}" if "error" in r else ""), flush=True)
        truth_path.write_text(json.dumps(truth, indent=1))
        if DEV == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
