"""Record realistic training loops with their ground truth: bare step time and GPU work per step.

A verdict about a trace is only as good as what it is checked against. For every loop below
this script measures, in one process and on one GPU:

``bare``      the loop with no profiler at all: GPU-side step time (CUDA events recorded at
              each step boundary, so the time the GPU experiences per step, not the time the
              host took to enqueue it), and the host's own cost of one step (``enqueue``: the
              time from the step's start to its last launch returning, measured with the queue
              drained first so the host never blocks on a full queue).
``profiled``  the same loop under torch.profiler with each collection setting (light: CPU +
              CUDA activities only; ``shapes``: + record_shapes; ``stacks``: + with_stack;
              ``heavy``: both), GPU-side step time inside the active window, so the profiler's
              inflation of step time is measured, not assumed.
``bare_after`` the bare loop again after the profilers have run (a profiler that leaves
              something active shows here).

The light and heavy traces are written (``<loop>.<setting>.pt.trace.json.gz``) and the
timings go to ``ground_truth.json`` beside them. The GPU work per step (the union of kernel,
copy and memset time per GPU-side step) is read from the light trace on the analysis side.

Loops (each a realistic program, not a planted micro-kernel):

lm_bf16          8-layer pre-norm transformer LM (d 768, 12 heads, seq 512, batch 24, vocab
                 16384), bf16 autocast, SDPA attention, fused AdamW; the loss is read back every
                 20 steps only. GPU-bound when not profiled. Expected: healthy.
lm_compiled      the same model under torch.compile (default mode). Expected: healthy.
mlp_graphed      a 6-layer 4096-wide MLP (TF32), forward + backward + Adam(capturable) captured
                 whole in one CUDA graph and replayed. Expected: healthy.
lm_sync_drain    lm_bf16 plus, every step, ``loss.item()``, ``torch.cuda.synchronize()`` and about
                 3 ms of Python logging work (formatting statistics). The GPU drains at the sync
                 and waits while the host logs: the idle after the sync returns is the sync's
                 cost. Expected: sync_bound first.
mlp_foreach      a tiny 24-layer MLP (width 256, batch 64) with AdamW(foreach=False): 24 x 2
                 parameters each updated by its own handful of kernels; thousands of
                 microsecond kernels per step. Expected: launch_bound (per-parameter optimizer),
                 no host_bound.
cnn_loader       a small CNN fed by a single-process DataLoader (num_workers=0) whose dataset
                 does real numpy preprocessing per sample. Expected: host_bound (input pipeline).
lm_fp32          lm_bf16's model in float32 with TF32 off. GPU-bound on FP32 SIMT GEMMs.
                 Expected: tensor_cores_unused, no host finding.
d2h_copies       a bf16 MLP forward whose 256 MiB of activations are copied to pageable host
                 memory every step (``.cpu()``). Expected: pageable_memcpy / memcpy_bound.

Usage::

    python tests/data/record/record_realistic.py --out DIR [--only NAME ...] [--settings light,heavy]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# Without it Kineto leaves CUPTI attached after the first profiled window and every later step
# pays for it (the "after" timings of recordings made before this line: lm_bf16 22.9 -> 26.6-27.5
# ms); the windows here are separated by unprofiled steps, so each teardown completes.
os.environ.setdefault("TEARDOWN_CUPTI", "1")
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_kineto import _finalize  # noqa: E402  (Kineto's own JSON, path prefixes stripped)

DEV = "cuda"
SMALL = False  # --dry-run: tiny sizes, to exercise the code on a CPU
SETTINGS = {
    "light": dict(record_shapes=False, with_stack=False),
    "shapes": dict(record_shapes=True, with_stack=False),
    "stacks": dict(record_shapes=False, with_stack=True),
    "heavy": dict(record_shapes=True, with_stack=True),
}
WAIT, WARMUP, ACTIVE = 2, 2, 4


# --------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LM(nn.Module):
    def __init__(self, vocab=16384, d=768, heads=12, layers=8, seq=512) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def _lm_loop(*, compiled=False, fp32=False, drain=False):
    torch.backends.cuda.matmul.allow_tf32 = not fp32
    torch.backends.cudnn.allow_tf32 = not fp32
    vocab, seq, batch = (512, 32, 2) if SMALL else (16384, 512, 24)
    model = LM(vocab=vocab, seq=seq, **(dict(d=64, heads=4, layers=2) if SMALL else {})).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model) if compiled else model
    data = torch.randint(0, vocab, (8, batch, seq + 1), device=DEV)
    stats = {"loss": []}

    def step(i):
        tok = data[i % data.shape[0]]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not fp32):
            logits = fwd(tok[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, vocab), tok[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if drain:
            stats["loss"].append(loss.item())
            torch.cuda.synchronize()
            _log_line(i, stats["loss"])
        elif i % 20 == 19:
            stats["loss"].append(loss.item())

    return step


def _log_line(i, losses, budget_s=0.003):
    """About 3 ms of real Python logging work: running statistics formatted into a line."""
    t_end = time.perf_counter() + budget_s
    line = ""
    while time.perf_counter() < t_end:
        window = losses[-50:]
        mean = sum(window) / len(window)
        var = sum((x - mean) ** 2 for x in window) / len(window)
        line = json.dumps({"step": i, "loss": round(losses[-1], 5), "mean": mean, "std": math.sqrt(var)})
    return line


def _mlp_graphed():
    torch.backends.cuda.matmul.allow_tf32 = True
    width, layers, batch = (64, 2, 16) if SMALL else (4096, 6, 2048)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())]).to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=True)
    xs = torch.randn(8, batch, width, device=DEV)
    ys = torch.randn(8, batch, width, device=DEV)
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
        loss = F.mse_loss(model(sx), sy)
        loss.backward()
        opt.step()

    def step(i):
        sx.copy_(xs[i % 8])
        sy.copy_(ys[i % 8])
        graph.replay()

    return step


def _mlp_foreach():
    width, layers, batch = 256, 24, 64
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.GELU())]).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    xs = torch.randn(8, batch, width, device=DEV)

    def step(i):
        loss = model(xs[i % 8]).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


class _Images(torch.utils.data.Dataset):
    """Decode-like preprocessing per sample, in numpy: uint8 -> float, blur, crop, flip, norm."""

    def __init__(self, n=4096, size=160, crop=128) -> None:
        if SMALL:
            size, crop = 24, 16
        rng = np.random.default_rng(0)
        self.raw = rng.integers(0, 255, size=(64, size, size, 3), dtype=np.uint8)
        self.n, self.size, self.crop = n, size, crop
        k = np.exp(-np.linspace(-2, 2, 9) ** 2)
        self.k = (k / k.sum()).astype(np.float32)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        img = self.raw[i % 64].astype(np.float32) / 255.0
        for axis in (0, 1):  # separable 9-tap blur, vectorised per tap
            img = sum(w * np.roll(img, j - 4, axis=axis) for j, w in enumerate(self.k))
        o = (i * 7) % (self.size - self.crop)
        img = img[o : o + self.crop, o : o + self.crop]
        if i % 2:
            img = img[:, ::-1]
        img = (img - 0.5) / 0.25
        return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))), i % 10


def _cnn_loader():
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(128, 256, 3, padding=1), nn.BatchNorm2d(256), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(256, 10),
    ).to(DEV, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = torch.utils.data.DataLoader(_Images(), batch_size=32, shuffle=True, num_workers=0)
    it = iter(loader)

    def step(i):
        nonlocal it
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        x, y = x.to(DEV, non_blocking=True), y.to(DEV, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x.contiguous(memory_format=torch.channels_last)), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _d2h_copies():
    width, batch = (64, 64) if SMALL else (8192, 8192)
    w = [torch.randn(width, width, device=DEV, dtype=torch.bfloat16) * 0.01 for _ in range(3)]
    xs = torch.randn(4, batch, width, device=DEV, dtype=torch.bfloat16)
    keep = []

    def step(i):
        h = xs[i % 4]
        for m in w:
            h = torch.relu(h @ m)
        feats = h.float()  # 256 MiB of activations
        keep.append(feats.cpu())  # into pageable host memory, as feature dumps often are
        del keep[:-2]

    return step


LOOPS = {
    "lm_bf16": lambda: _lm_loop(),
    "lm_compiled": lambda: _lm_loop(compiled=True),
    "mlp_graphed": _mlp_graphed,
    "lm_sync_drain": lambda: _lm_loop(drain=True),
    "mlp_foreach": _mlp_foreach,
    "cnn_loader": _cnn_loader,
    "lm_fp32": lambda: _lm_loop(fp32=True),
    "d2h_copies": _d2h_copies,
}
# Which traces are kept per loop; the other settings are only timed.
KEEP = {"light", "heavy"}


# --------------------------------------------------------------------------------------------
# measurement
# --------------------------------------------------------------------------------------------

def _gpu_steps(step, first: int, n: int) -> list[float]:
    """GPU-side step times (ms): CUDA events at each step boundary on the current stream."""
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    for k in range(n):
        ev[k].record()
        step(first + k)
    ev[n].record()
    torch.cuda.synchronize()
    return [ev[k].elapsed_time(ev[k + 1]) for k in range(n)]


def _enqueue(step, first: int, n: int) -> list[float]:
    """The host's own cost of one step (ms): queue drained first, so the host never blocks
    on a full launch queue and the time is what it takes to issue the step."""
    out = []
    for k in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(first + k)
        out.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return out


def timed_window(step, first: int, wait: int, warmup: int, active: int, on_ready, **profile_kw) -> list[float]:
    """GPU-side times (ms) of every step of one torch.profiler window (wait + warmup +
    active steps); the last active step holds ``on_ready`` (the trace's processing)."""
    n = wait + warmup + active
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    torch.cuda.synchronize()
    with profile(schedule=schedule(wait=wait, warmup=warmup, active=active), on_trace_ready=on_ready, **profile_kw) as prof:
        for k in range(n):
            ev[k].record()
            step(first + k)
            prof.step()
        ev[n].record()
    torch.cuda.synchronize()
    return [ev[k].elapsed_time(ev[k + 1]) for k in range(n)]


def _profiled(step, first: int, setting: str, out_dir: str | None, name: str) -> dict:
    """Run WAIT + WARMUP + ACTIVE steps under torch.profiler; GPU-side times of the active steps."""
    tmp = tempfile.mkdtemp(prefix="rr_")
    raw = os.path.join(tmp, "trace.json")
    t0 = time.perf_counter()
    times = timed_window(step, first, WAIT, WARMUP, ACTIVE, lambda p: p.export_chrome_trace(raw),
                         activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], **SETTINGS[setting])[WAIT + WARMUP:]
    wall = time.perf_counter() - t0
    rec = {"gpu_step_ms": [round(t, 4) for t in times], "median_ms": round(statistics.median(times), 4), "wall_s": round(wall, 2)}
    if out_dir and setting in KEEP:
        dst = os.path.join(out_dir, f"{name}.{setting}.pt.trace.json.gz")
        _finalize(raw, dst, host_name="gpu-host")
        rec["trace"] = os.path.basename(dst)
        rec["bytes"] = os.path.getsize(dst)
    return rec


def measure(name: str, out_dir: str | None, settings: list[str], n_bare: int) -> dict:
    torch.manual_seed(0)
    t0 = time.perf_counter()
    step = LOOPS[name]()
    i = 0
    for _ in range(5):  # warm-up: compilation, autotuning, allocator, cuBLAS handles
        step(i)
        i += 1
    torch.cuda.synchronize()
    setup_s = time.perf_counter() - t0
    bare = _gpu_steps(step, i, n_bare)
    i += n_bare
    enq = _enqueue(step, i, max(n_bare // 2, 5))
    i += max(n_bare // 2, 5)
    rec = {
        "setup_s": round(setup_s, 1),
        "bare": {"gpu_step_ms": [round(t, 4) for t in bare], "median_ms": round(statistics.median(bare), 4)},
        "enqueue": {"host_ms": [round(t, 4) for t in enq], "median_ms": round(statistics.median(enq), 4)},
        "profiled": {},
    }
    for s in settings:
        rec["profiled"][s] = _profiled(step, i, s, out_dir, name)
        i += WAIT + WARMUP + ACTIVE
        rec["profiled"][s]["ratio"] = round(rec["profiled"][s]["median_ms"] / rec["bare"]["median_ms"], 3)
    after = _gpu_steps(step, i, n_bare)
    rec["bare_after"] = {"gpu_step_ms": [round(t, 4) for t in after], "median_ms": round(statistics.median(after), 4)}
    return rec


def _dry_run() -> None:
    """Stand-ins for the CUDA timing calls so the loops can be exercised on a CPU."""
    global DEV, WAIT, WARMUP, ACTIVE, SMALL

    class _Event:
        def __init__(self, **_):
            self.t = 0.0

        def record(self):
            self.t = time.perf_counter()

        def elapsed_time(self, other):
            return (other.t - self.t) * 1e3

    DEV, WAIT, WARMUP, ACTIVE, SMALL = "cpu", 1, 1, 1, True
    torch.cuda.Event = _Event
    torch.cuda.synchronize = lambda *a: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.get_device_name = lambda *a: "cpu (dry run)"
    LOOPS.pop("mlp_graphed")


def main(argv=None) -> int:
    global ACTIVE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--settings", default="light,shapes,stacks,heavy")
    ap.add_argument("--bare-steps", type=int, default=30)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny step counts: checks the script, measures nothing")
    ap.add_argument("--active", type=int, help=f"active steps per profiled window (default {ACTIVE}): "
                    "hundreds make the large real traces of benchmarks/README.md")
    args = ap.parse_args(argv)
    if args.dry_run:
        _dry_run()
    if args.active:
        ACTIVE = args.active
    os.makedirs(args.out, exist_ok=True)
    settings = args.settings.split(",")
    gt_path = os.path.join(args.out, "ground_truth.json")
    truth = json.load(open(gt_path)) if os.path.exists(gt_path) else {"loops": {}}
    truth["recorded_with"] = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE},
        "settings": SETTINGS,
    }
    for name in args.only or LOOPS:
        t0 = time.perf_counter()
        try:
            truth["loops"][name] = measure(name, args.out, settings, args.bare_steps)
        except Exception as e:  # one loop failing must not lose the others' measurements
            truth["loops"][name] = {"error": f"{type(e).__name__}: {e}"}
        r = truth["loops"][name]
        ratios = {s: v["ratio"] for s, v in r.get("profiled", {}).items()}
        print(f"{name}: bare {r.get('bare', {}).get('median_ms')} ms, enqueue {r.get('enqueue', {}).get('median_ms')} ms, "
              f"after {r.get('bare_after', {}).get('median_ms')} ms, ratios {ratios}, {time.perf_counter() - t0:.0f} s"
              + (f" ERROR {r['error']}" if "error" in r else ""), flush=True)
        with open(gt_path, "w") as fh:
            json.dump(truth, fh, indent=1)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
