"""Record real torch.profiler (Kineto) traces of workloads with one planted bottleneck each.

The traces written by this script are committed under ``tests/data/kineto/`` so that the
analysis code can be tested on real data on machines without a GPU.  Every workload is a
function below; each produces exactly one trace file named ``<workload>.pt.trace.json.gz``
(the ``export_chrome`` variant writes ``tiny_kernels_export_chrome.json.gz``).

Usage::

    python tests/data/record/record_kineto.py --out DIR [--only NAME ...]
    python tests/data/record/record_kineto.py --out DIR --dry-run      # CPU, tiny sizes
    python tests/data/record/record_kineto.py --summarize DIR          # print timeline facts

All GPU workloads use ``torch.profiler.profile(activities=[CPU, CUDA],
schedule=schedule(wait=1, warmup=2, active=K), record_shapes=True,
on_trace_ready=tensorboard_trace_handler(dir, use_gzip=True))`` and call ``prof.step()`` once
per iteration, so ``ProfilerStep#N`` ranges exist.  Each workload runs one un-profiled
iteration first (CUDA context, cuBLAS handles, caching allocator).

Workloads and the one bottleneck each plants
--------------------------------------------
pageable_h2d (planted: ``pageable_memcpy``)
    Each step copies a 256 MiB *pageable* (not pinned) float32 host tensor to the GPU with
    ``.to('cuda')`` and then runs three elementwise kernels and a sum on it.  The
    "Memcpy HtoD (Pageable -> Device)" copies take almost the whole step; the kernels are
    a fraction of a millisecond.  Fix: pinned memory + ``non_blocking=True`` (or keep the
    data on the GPU).

sync_every_step (planted: ``sync_bound``)
    100 blocks per step; each block runs three bandwidth-bound elementwise kernels and two
    reductions on a 64 MiB tensor (each kernel takes longer than the host needs to launch it)
    and synchronises twice: ``y.mean().item()`` to record the value for logging and
    ``(y.amax() > 2.5).item()`` for data-dependent control flow.  Each ``.item()`` is a
    device-to-host copy plus a stream synchronisation: the host blocks until the GPU drains,
    then has to launch the next kernels, so the GPU idles after every sync (200 per step).
    The host does almost nothing between a sync returning and its next launch, so the idle is
    caused by the syncs themselves, not by host work.
    Fix: keep the values on the GPU (``torch.where`` instead of the branch, accumulate the
    logged value on the device) and read them back once per step or every N steps.

tiny_kernels (planted: ``launch_bound``)
    600 elementwise ops per step on 2048-element tensors.  Each kernel runs for a couple of
    microseconds, less than the host needs to launch it, so the GPU idles between kernels.
    Fix: fuse (torch.compile), batch the small tensors, or use CUDA graphs.

starved_input (planted: ``host_bound``)
    A real ``torch.utils.data.DataLoader`` (num_workers=0) over a Dataset whose
    ``__getitem__`` does real numpy preprocessing per sample (decode-like uint8 -> float,
    FFT-based blur, random crop, flip, normalisation) on 128x128 images cropped to 112x112.
    A batch of 32 costs 10-20 ms of CPU time, while the small CNN's training step on the GPU
    takes about a millisecond.  The GPU waits on
    the input pipeline.  Fix: ``num_workers > 0``, cheaper/GPU-side preprocessing.

fp32_matmul_no_tf32 (planted: ``tensor_cores_unused``)
    ``torch.backends.cuda.matmul.allow_tf32 = False`` and ``torch.backends.cudnn.allow_tf32
    = False``; ten 8192x8192 float32 matmuls per step.  The GPU is kept busy (no host
    problem), but the GEMMs run on the FP32 SIMT pipes instead of tensor cores.  Fix: TF32
    (``torch.set_float32_matmul_precision('high')``) or bf16 autocast.

healthy_bf16_gemm (planted: ``healthy``)
    The same loop of ten 8192x8192 matmuls per step, in bfloat16: tensor-core GEMMs with the
    GPU saturated.  Healthy control.

memory_bound_elementwise (planted: ``healthy``)
    Elementwise ops (add, mul, addcmul, sub) on 256 MiB float32 tensors, 40 per step.  Each
    kernel runs for a few hundred microseconds at close to HBM bandwidth and the host is far
    ahead, so at the timeline level the GPU is busy all the time.  Healthy control at the
    timeline level (the kernels are memory bound, which only a kernel-level analysis sees).

train_loop (planted: ``healthy``)
    A realistic small training loop: a 6-layer pre-norm transformer language model
    (d_model 1024, 16 heads, sequence 1024, batch 64, vocabulary 8192) on synthetic tokens
    from a DataLoader with ``pin_memory=True, num_workers=2``, bf16 autocast, forward,
    cross-entropy loss, backward, AdamW step, and the loss read back with ``.item()`` once per
    step for logging.  Recorded with ``record_shapes=True, with_stack=True,
    profile_memory=False``.  Reasonably healthy: the GPU is busy for almost all of the step;
    the only idle time is the short gap after each step's loss read-back.  (Without the
    per-step read-back the host runs a step ahead of the GPU, and the active window then holds
    kernels launched during the warm-up steps, with no launch event to link them to.)

tiny_kernels_export_chrome (planted: ``launch_bound``)
    The tiny_kernels workload with two active steps, written by
    ``prof.export_chrome_trace("x.json")`` (plain, uncompressed JSON from that API) instead
    of the TensorBoard handler, then gzip-compressed for storage.

cpu_only_train (planted: ``healthy``)
    A CPU-only trace (activities=[CPU]) of a small MLP training loop (SGD, cross-entropy) on
    synthetic data, recorded with a CPU build of torch and ``with_stack=True``.  It has no
    GPU events at all: a reader must treat GPU metrics as missing, not zero.

Post-processing
---------------
The recorded JSON text is kept byte for byte as Kineto wrote it (layout, number formatting,
key order) except for three in-place string edits for privacy: ``host_name`` (when present) is
replaced by a neutral name, ``traceName`` (the temporary path Kineto wrote to) is replaced by
the final file name, and any absolute path prefixes of the interpreter install, the temporary
directory or this checkout inside strings are removed (python frames are normally already
relative).  The result is re-compressed with gzip.
"""

from __future__ import annotations

import argparse
import gc
import glob
import gzip
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Callable, Dict, List

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))

# Set by main(): dry-run shrinks everything and runs on the CPU.
DRY = False
DEV = "cuda"


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def _sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def _activities(cpu_only: bool = False) -> List[ProfilerActivity]:
    if cpu_only or DEV != "cuda":
        return [ProfilerActivity.CPU]
    return [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def _sanitize_text(text: str) -> str:
    """Shorten absolute path prefixes that would reveal the recording machine's layout."""
    prefixes = set()
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            prefixes.add(p.rstrip("/") + "/")
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix):
        prefixes.add(p.rstrip("/") + "/")
    prefixes.add(REPO_ROOT.rstrip("/") + "/")
    prefixes.add(tempfile.gettempdir().rstrip("/") + "/")
    for p in sorted(prefixes, key=len, reverse=True):
        if len(p) > 1:
            text = text.replace(p, "")
    return text


def _finalize(raw_path: str, out_path: str, host_name: str) -> None:
    """Copy a Kineto trace (plain or gz) to out_path (gzip), keeping Kineto's own JSON text.

    Only string values are edited in place (host_name, traceName, absolute path prefixes); the
    layout, number formatting and key order stay exactly as Kineto wrote them.
    """
    opener = gzip.open if raw_path.endswith(".gz") else open
    with opener(raw_path, "rt", encoding="utf-8") as fh:
        text = fh.read()
    final_name = os.path.basename(out_path)[: -len(".gz")]
    text = re.sub(r'("host_name"\s*:\s*)"[^"]*"', lambda m: m.group(1) + json.dumps(host_name), text)
    text = re.sub(r'("traceName"\s*:\s*)"[^"]*"', lambda m: m.group(1) + json.dumps(final_name), text)
    text = _sanitize_text(text)
    json.loads(text)  # still valid JSON
    with gzip.open(out_path, "wt", encoding="utf-8", compresslevel=9) as fh:
        fh.write(text)


def _record(name: str, out_dir: str, step_fn: Callable[[int], None], active: int, *,
            with_stack: bool = False, cpu_only: bool = False, host_name: str = "gpu-host",
            sync_each_step: bool = False) -> str:
    """Run step_fn under the profiler schedule and write <out_dir>/<name>.pt.trace.json.gz."""
    step_fn(-1)  # un-profiled warm-up iteration
    _sync()
    tmp = tempfile.mkdtemp(prefix="kineto_")
    handler = tensorboard_trace_handler(tmp, worker_name=name, use_gzip=True)
    wait, warmup = 1, 2
    t0 = time.perf_counter()
    with profile(activities=_activities(cpu_only), schedule=schedule(wait=wait, warmup=warmup, active=active),
                 record_shapes=True, with_stack=with_stack, profile_memory=False,
                 on_trace_ready=handler) as prof:
        for i in range(wait + warmup + active):
            step_fn(i)
            if sync_each_step:
                _sync()
            prof.step()
    _sync()
    files = glob.glob(os.path.join(tmp, "*.pt.trace.json.gz"))
    assert len(files) == 1, files
    out = os.path.join(out_dir, f"{name}.pt.trace.json.gz")
    _finalize(files[0], out, host_name)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"[{name}] {time.perf_counter() - t0:.2f}s  -> {out} ({os.path.getsize(out)/1024:.0f} KiB)", flush=True)
    return out


def _free() -> None:
    gc.collect()
    if DEV == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------
# workloads
# --------------------------------------------------------------------------------------------

def pageable_h2d(out_dir: str) -> str:
    n = (1 << 16) if DRY else (64 << 20)  # 64 Mi float32 = 256 MiB
    host = torch.randn(n)  # ordinary pageable host memory (NOT pinned)
    assert not host.is_pinned()

    def step(i: int) -> None:
        x = host.to(DEV)  # synchronous pageable H2D copy
        y = x.mul(2.0).add_(1.0)
        y = torch.relu(y)
        y.sum()

    return _record("pageable_h2d", out_dir, step, active=4)


def sync_every_step(out_dir: str) -> str:
    n = (1 << 14) if DRY else (16 << 20)  # 16 Mi float32 = 64 MiB
    blocks = 10 if DRY else 100
    x = torch.randn(n, device=DEV)
    history: List[float] = []

    def step(i: int) -> None:
        h = x
        for b in range(blocks):
            y = torch.sin(h)
            y = y * y
            y = y + 1.0  # values in [1, 2]
            history.append(y.mean().item())  # sync #1 (logging): D2H copy + stream sync, GPU drains
            if (y.amax() > 2.5).item():  # sync #2 (data-dependent control flow), never true
                y = y.clamp(max=2.0)
            h = y

    out = _record("sync_every_step", out_dir, step, active=4)
    del x
    return out


def _tiny_step_fn(ops_per_step: int):
    n = 2048
    x0 = torch.randn(n, device=DEV)
    w = torch.randn(n, device=DEV)

    def step(i: int) -> None:
        x = x0
        for _ in range(ops_per_step // 4):
            x = x * w
            x = x + 0.5
            x = torch.tanh(x)
            x = x - w

    return step


def tiny_kernels(out_dir: str) -> str:
    return _record("tiny_kernels", out_dir, _tiny_step_fn(40 if DRY else 600), active=4)


def tiny_kernels_export_chrome(out_dir: str) -> str:
    """tiny_kernels with 2 active steps, written by prof.export_chrome_trace (plain JSON)."""
    name = "tiny_kernels_export_chrome"
    step = _tiny_step_fn(40 if DRY else 600)
    step(-1)
    _sync()
    tmp = tempfile.mkdtemp(prefix="kineto_")
    raw = os.path.join(tmp, "x.json")

    def on_ready(p) -> None:
        p.export_chrome_trace(raw)

    with profile(activities=_activities(), schedule=schedule(wait=1, warmup=2, active=2),
                 record_shapes=True, on_trace_ready=on_ready) as prof:
        for i in range(5):
            step(i)
            prof.step()
    _sync()
    out = os.path.join(out_dir, f"{name}.json.gz")
    _finalize(raw, out, "gpu-host")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"[{name}] -> {out} ({os.path.getsize(out)/1024:.0f} KiB)", flush=True)
    return out


class _PreprocDataset(torch.utils.data.Dataset):
    """Synthetic images with real CPU-heavy numpy preprocessing in __getitem__."""

    def __init__(self, n: int, size: int, out: int):
        self.n, self.size, self.out = n, size, out
        self.mean = np.array([0.485, 0.456, 0.406], dtype=np.float32)[:, None, None]
        self.std = np.array([0.229, 0.224, 0.225], dtype=np.float32)[:, None, None]
        k = np.zeros((size, size), dtype=np.float32)
        r = 3
        k[:r, :r] = 1.0
        k = np.roll(k, (-(r // 2), -(r // 2)), axis=(0, 1))
        self.kernel_f = np.fft.rfft2(k / k.sum())

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int):
        rng = np.random.default_rng(idx)
        img = rng.integers(0, 256, size=(3, self.size, self.size), dtype=np.uint8)  # "decoded" image
        x = img.astype(np.float32) / 255.0
        x = np.fft.irfft2(np.fft.rfft2(x) * self.kernel_f, s=x.shape[-2:]).astype(np.float32)  # blur
        # colour jitter
        x = np.clip(x * rng.uniform(0.8, 1.2) + rng.uniform(-0.1, 0.1), 0.0, 1.0)
        i, j = rng.integers(0, self.size - self.out + 1, size=2)
        x = x[:, i:i + self.out, j:j + self.out]  # random crop
        if rng.random() < 0.5:
            x = x[:, :, ::-1]  # horizontal flip
        x = (x - self.mean) / self.std
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), int(rng.integers(0, 10))


class _SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(128, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def starved_input(out_dir: str) -> str:
    size, crop, batch = (40, 32, 4) if DRY else (128, 112, 32)
    ds = _PreprocDataset(n=10_000, size=size, out=crop)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=0)
    model = _SmallCNN().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    it = iter(loader)

    def step(i: int) -> None:
        x, y = next(it)
        x, y = x.to(DEV), y.to(DEV)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return _record("starved_input", out_dir, step, active=4)


def _gemm_loop(name: str, out_dir: str, dtype: torch.dtype, allow_tf32: bool) -> str:
    n = 256 if DRY else 8192
    per_step = 3 if DRY else 10
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    try:
        a = torch.randn(n, n, device=DEV, dtype=dtype)
        b = torch.randn(n, n, device=DEV, dtype=dtype)
        c = torch.empty(n, n, device=DEV, dtype=dtype)

        def step(i: int) -> None:
            for _ in range(per_step):
                torch.matmul(a, b, out=c)

        # one sync per step (a training loop's loss read-back): negligible next to the step
        return _record(name, out_dir, step, active=3, sync_each_step=True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def fp32_matmul_no_tf32(out_dir: str) -> str:
    return _gemm_loop("fp32_matmul_no_tf32", out_dir, torch.float32, allow_tf32=False)


def healthy_bf16_gemm(out_dir: str) -> str:
    return _gemm_loop("healthy_bf16_gemm", out_dir, torch.bfloat16, allow_tf32=False)


def memory_bound_elementwise(out_dir: str) -> str:
    n = (1 << 16) if DRY else (64 << 20)  # 64 Mi float32 = 256 MiB per tensor
    a = torch.randn(n, device=DEV)
    b = torch.randn(n, device=DEV)
    c = torch.empty(n, device=DEV)

    def step(i: int) -> None:
        for _ in range(10):
            torch.add(a, b, out=c)
            c.mul_(0.5)
            torch.addcmul(a, c, a, value=0.1, out=b)  # b = a + 0.1*c*a stays bounded
            torch.sub(b, a, out=c)

    return _record("memory_bound_elementwise", out_dir, step, active=3, sync_each_step=True)


class _Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class _TinyLM(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


class _TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n: int, seq: int, vocab: int):
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int):
        g = torch.Generator().manual_seed(idx)
        toks = torch.randint(0, self.vocab, (self.seq + 1,), generator=g)
        return toks[:-1], toks[1:]


def train_loop(out_dir: str) -> str:
    if DRY:
        vocab, d, heads, layers, seq, batch = 256, 64, 4, 2, 32, 4
    else:
        vocab, d, heads, layers, seq, batch = 8192, 1024, 16, 6, 1024, 64
    torch.manual_seed(0)
    model = _TinyLM(vocab, d, heads, layers, seq).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    ds = _TokenDataset(100_000, seq, vocab)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=2,
                                         pin_memory=(DEV == "cuda"), drop_last=True,
                                         persistent_workers=True)
    it = iter(loader)
    losses: List[float] = []

    def step(i: int) -> None:
        x, y = next(it)
        x, y = x.to(DEV, non_blocking=True), y.to(DEV, non_blocking=True)
        with torch.autocast(device_type=DEV, dtype=torch.bfloat16, enabled=(DEV == "cuda")):
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # log the loss once per step (the loop's one sync per step)

    out = _record("train_loop", out_dir, step, active=3, with_stack=True)
    del it, loader
    return out


def cpu_only_train(out_dir: str) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x_all = torch.randn(64 * 64, 256)
    y_all = torch.randint(0, 10, (64 * 64,))

    def step(i: int) -> None:
        for j in range(4):  # 4 mini-batches per step
            k = (max(i, 0) * 4 + j) % 64
            x, y = x_all[k * 64:(k + 1) * 64], y_all[k * 64:(k + 1) * 64]
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return _record("cpu_only_train", out_dir, step, active=3, with_stack=True, cpu_only=True,
                   host_name="cpu-host")


GPU_WORKLOADS: Dict[str, Callable[[str], str]] = {
    "pageable_h2d": pageable_h2d,
    "sync_every_step": sync_every_step,
    "tiny_kernels": tiny_kernels,
    "starved_input": starved_input,
    "fp32_matmul_no_tf32": fp32_matmul_no_tf32,
    "healthy_bf16_gemm": healthy_bf16_gemm,
    "memory_bound_elementwise": memory_bound_elementwise,
    "train_loop": train_loop,
    "tiny_kernels_export_chrome": tiny_kernels_export_chrome,
}
CPU_WORKLOADS: Dict[str, Callable[[str], str]] = {"cpu_only_train": cpu_only_train}
ALL = {**GPU_WORKLOADS, **CPU_WORKLOADS}


# --------------------------------------------------------------------------------------------
# environment + summary
# --------------------------------------------------------------------------------------------

def environment() -> dict:
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "numpy": np.__version__,
        "cpu": platform.processor() or platform.machine(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cudnn"] = torch.backends.cudnn.version()
        props = torch.cuda.get_device_properties(0)
        env["sm_count"] = props.multi_processor_count
        env["gpu_memory_mib"] = props.total_memory // (1 << 20)
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
            env["nvidia_smi"] = q.stdout.strip()
            env["driver"] = q.stdout.strip().split(",")[1].strip()
        except Exception as exc:  # pragma: no cover
            env["nvidia_smi_error"] = repr(exc)
    return env


def _intervals_union(iv: List[tuple]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(iv):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def summarize(path: str) -> dict:
    """Timeline facts of one trace (used to check that the planted effect is really there)."""
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    kern = [e for e in ev if e.get("cat") == "kernel"]
    mcpy = [e for e in ev if e.get("cat") in ("gpu_memcpy",)]
    mset = [e for e in ev if e.get("cat") in ("gpu_memset",)]
    gpu = kern + mcpy + mset
    res: dict = {"file": os.path.basename(path), "events": len(doc["traceEvents"]), "steps": len(steps)}
    if steps:
        t0 = min(e["ts"] for e in steps)
        t1 = max(e["ts"] + e["dur"] for e in steps)
        res["cpu_step_ms_median"] = float(np.median([e["dur"] for e in steps])) / 1e3
        res["cpu_span_ms"] = (t1 - t0) / 1e3
    if gpu:
        g0 = min(e["ts"] for e in gpu)
        g1 = max(e["ts"] + e["dur"] for e in gpu)
        span = g1 - g0
        busy = _intervals_union([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
        res.update({
            "gpu_span_ms": span / 1e3,
            "gpu_busy_pct": 100.0 * busy / span if span else 0.0,
            "kernel_ms": sum(e["dur"] for e in kern) / 1e3,
            "memcpy_ms": sum(e["dur"] for e in mcpy) / 1e3,
            "memset_ms": sum(e["dur"] for e in mset) / 1e3,
            "kernels": len(kern),
            "memcpys": len(mcpy),
            "kernel_median_us": float(np.median([e["dur"] for e in kern])) if kern else None,
        })
        by_name: Dict[str, float] = {}
        for e in kern:
            by_name[e["name"]] = by_name.get(e["name"], 0.0) + e["dur"]
        res["top_kernels"] = sorted(((round(v / 1e3, 3), k[:120]) for k, v in by_name.items()), reverse=True)[:3]
        mk: Dict[str, int] = {}
        for e in mcpy:
            mk[e["name"]] = mk.get(e["name"], 0) + 1
        res["memcpy_kinds"] = mk
        # idle gaps between GPU activities, split by what ran just before the gap
        gs = sorted(gpu, key=lambda e: e["ts"])
        end, prev, idle_after_dtoh, idle_other = gs[0]["ts"] + gs[0]["dur"], gs[0], 0.0, 0.0
        for e in gs[1:]:
            if e["ts"] > end:
                if "DtoH" in prev["name"]:
                    idle_after_dtoh += e["ts"] - end
                else:
                    idle_other += e["ts"] - end
            if e["ts"] + e["dur"] > end:
                end, prev = e["ts"] + e["dur"], e
        res["idle_after_dtoh_pct"] = 100.0 * idle_after_dtoh / span if span else 0.0
        res["idle_other_pct"] = 100.0 * idle_other / span if span else 0.0
        gstep = [e for e in ev if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("ProfilerStep#")]
        if gstep:
            res["gpu_step_ms_median"] = float(np.median([e["dur"] for e in gstep])) / 1e3
    rt = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    syncs = [e for e in rt if "Synchronize" in e["name"]]
    res["runtime_calls"] = len(rt)
    res["sync_calls"] = len(syncs)
    res["sync_ms"] = sum(e["dur"] for e in syncs) / 1e3
    return res


def main(argv=None) -> int:
    global DRY, DEV
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="directory for the traces")
    ap.add_argument("--only", nargs="+", choices=sorted(ALL), help="record only these workloads")
    ap.add_argument("--dry-run", action="store_true", help="CPU only, tiny sizes: check the script runs")
    ap.add_argument("--summarize", metavar="DIR", help="print timeline facts of the traces in DIR")
    args = ap.parse_args(argv)

    if args.summarize:
        for p in sorted(glob.glob(os.path.join(args.summarize, "*.json.gz"))):
            print(json.dumps(summarize(p)))
        return 0
    if not args.out:
        ap.error("--out is required")
    os.makedirs(args.out, exist_ok=True)
    DRY = args.dry_run
    DEV = "cuda" if (torch.cuda.is_available() and not DRY) else "cpu"
    names = args.only or (sorted(ALL) if DRY else (list(GPU_WORKLOADS) if DEV == "cuda" else list(CPU_WORKLOADS)))
    env = environment()
    print(json.dumps(env), flush=True)
    with open(os.path.join(args.out, f"record_env_{DEV}.json"), "w") as fh:
        json.dump(env, fh, indent=1)
    if DEV != "cuda" and not DRY:
        bad = [n for n in names if n in GPU_WORKLOADS]
        if bad:
            ap.error(f"no GPU: cannot record {bad}")
    failed = []
    for n in names:
        try:
            ALL[n](args.out)
        except Exception as exc:  # keep going: record what we can
            import traceback
            traceback.print_exc()
            failed.append((n, repr(exc)))
        _free()
    if failed:
        print("FAILED:", failed, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
