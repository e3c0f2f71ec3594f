"""Record GPU-memory workloads with known answers: Kineto traces with ``profile_memory=True`` and,
beside each, what the CUDA caching allocator itself measured over the same profiled steps.

For every workload below, in one process on one GPU:

``trace``      torch.profiler (CPU + CUDA activities, ``profile_memory=True``, no shapes, stacks
               only where stated) over ``ACTIVE`` steps, started right after
               ``torch.cuda.reset_peak_memory_stats()``; written as ``<name>.pt.trace.json.gz``.
``truth``      ``torch.cuda.max_memory_allocated()`` / ``max_memory_reserved()`` over those
               profiled steps, the same per step (reset at each step's start), the memory still
               allocated after each step (synchronised), and the device's total memory
               (``get_device_properties().total_memory`` and ``mem_get_info``).
``timing``     the step time (wall, synchronised each step, median of ``TIMED`` steps) bare, under
               the light profiler, and under the light profiler with ``profile_memory=True``: the
               collection cost of ``profile_memory`` measured, not assumed.

Everything lands in ``ground_truth.json``. ``--snapshot NAME`` also records that workload's CUDA
memory snapshot (``torch.cuda.memory._dump_snapshot``, a pickle) for the snapshot reader's tests.

Workloads (expected answer in brackets):

graph_leak        a 4-layer MLP trained with SGD; every step also computes a validation loss
                  without ``torch.no_grad()`` and keeps it (``val_losses.append(val_loss)``), so
                  the autograd graph of each validation forward, with its saved activations,
                  stays alive. [memory_leak, a constant rate per step]
activation_heavy  a 12-layer MLP (width 1024, LayerNorm + GELU) on a batch of 16384 rows with SGD:
                  a few tens of MB of parameters, GBs of saved activations; the peak is at the end
                  of the forward / start of the backward. Recorded with stacks. [activations
                  dominate the peak]
optimizer_heavy   a 4-layer 8192-wide MLP (268M parameters) with Adam (foreach) on a batch of 32:
                  parameters, gradients and two Adam states of 1 GiB each; the peak is inside
                  ``optimizer.step`` (foreach temporaries). [optimizer state dominates]
fragmenting       an MLP fed variable-length batches whose token count grows 35% per step (over a cycle of 8): each
                  step needs blocks larger than any the allocator has cached, so reserved grows
                  to a multiple of what is allocated. [memory_fragmentation]
healthy           a 6-layer 2048-wide MLP with AdamW, constant shapes. [no memory warning]

Usage::

    python tests/data/record/record_memory.py --out DIR [--only NAME ...] [--snapshot NAME]
    python tests/data/record/record_memory.py --program NAME --steps N   # the bare loop, for `proflab run`
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEV = "cuda"
SMALL = False  # --dry-run: tiny sizes, to exercise the code on a CPU
BARE_WARMUP, ACTIVE, TIMED = 3, 4, 12
MB = 1 << 20


def _mlp(width, layers, *, norm=False, act=nn.ReLU):
    mods = []
    for _ in range(layers):
        mods.append(nn.Linear(width, width))
        if norm:
            mods.append(nn.LayerNorm(width))
        mods.append(act())
    return nn.Sequential(*mods).to(DEV)


def graph_leak():
    width, layers, batch = (64, 2, 32) if SMALL else (1024, 4, 2048)
    model = _mlp(width, layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, width, device=DEV), torch.randn(batch, width, device=DEV)
    xv, yv = torch.randn(batch, width, device=DEV), torch.randn(batch, width, device=DEV)
    val_losses = []

    def step(i):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        val_loss = F.mse_loss(model(xv), yv)  # no torch.no_grad(): the graph is built...
        val_losses.append(val_loss)  # ...and kept alive with every saved activation

    step.reset = val_losses.clear
    return step


def activation_heavy():
    width, layers, batch = (64, 3, 64) if SMALL else (1024, 12, 16384)
    model = _mlp(width, layers, norm=True, act=nn.GELU)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, width, device=DEV), torch.randn(batch, width, device=DEV)

    def step(i):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def optimizer_heavy():
    width, layers, batch = (64, 2, 8) if SMALL else (8192, 4, 32)
    model = _mlp(width, layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=True)
    x, y = torch.randn(batch, width, device=DEV), torch.randn(batch, width, device=DEV)

    def step(i):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def fragmenting():
    width, layers, base = (64, 2, 64) if SMALL else (2048, 4, 4096)
    model = _mlp(width, layers, act=nn.GELU)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    counter = {"n": 0}

    def step(i):
        # variable-length batches: the token count grows with every step taken
        tokens = int(base * 1.35 ** (counter["n"] % 8))
        counter["n"] += 1
        x = torch.randn(tokens, width, device=DEV)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def reset():
        counter["n"] = 0

    step.reset = reset
    return step


def healthy():
    width, layers, batch = (64, 2, 32) if SMALL else (2048, 6, 512)
    model = _mlp(width, layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(batch, width, device=DEV), torch.randn(batch, width, device=DEV)

    def step(i):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


WORKLOADS = {
    "graph_leak": (graph_leak, {}),
    "activation_heavy": (activation_heavy, {"with_stack": True}),
    "optimizer_heavy": (optimizer_heavy, {}),
    "fragmenting": (fragmenting, {}),
    "healthy": (healthy, {}),
}


def _sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def _timed(step, n, prof=None):
    """Median wall time of a step, synchronised at every step end (ms)."""
    times = []
    for i in range(n):
        _sync()
        t0 = time.perf_counter()
        step(i)
        _sync()
        times.append((time.perf_counter() - t0) * 1e3)
        if prof is not None:
            prof.step()
    return round(statistics.median(times), 4), [round(t, 4) for t in times]


def _acts():
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])


def _reset(step):
    getattr(step, "reset", lambda: None)()
    import gc

    gc.collect()
    if DEV == "cuda":
        torch.cuda.empty_cache()


def record(name, out_dir, snapshot=False):
    make, opts = WORKLOADS[name]
    torch.manual_seed(0)
    step = make()
    for i in range(BARE_WARMUP):
        step(i)
    _sync()
    truth = {"workload": name, "active_steps": ACTIVE, "with_stack": bool(opts.get("with_stack"))}
    if DEV == "cuda":
        truth["memory_allocated_before_mib"] = torch.cuda.memory_allocated() / MB
        torch.cuda.reset_peak_memory_stats()
    if snapshot and DEV == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=4000, stacks="python")
    tmp = tempfile.mkdtemp(prefix="mem_")
    end_alloc = []
    prof = profile(activities=_acts(), record_shapes=False, with_stack=bool(opts.get("with_stack")),
                   profile_memory=True)
    prof.start()
    for i in range(ACTIVE):
        step(BARE_WARMUP + i)
        _sync()
        if DEV == "cuda":
            end_alloc.append(torch.cuda.memory_allocated() / MB)
        prof.step()
    prof.stop()
    _sync()
    if DEV == "cuda":
        truth["max_memory_allocated_mib"] = torch.cuda.max_memory_allocated() / MB
        truth["max_memory_reserved_mib"] = torch.cuda.max_memory_reserved() / MB
        truth["memory_allocated_after_step_mib"] = end_alloc
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        truth["device_total_memory_mib"] = props.total_memory / MB
        truth["mem_get_info_total_mib"] = total / MB
        truth["device_name"] = props.name
    if snapshot and DEV == "cuda":
        snap = os.path.join(out_dir, f"{name}.snapshot.pickle")
        torch.cuda.memory._dump_snapshot(snap)
        torch.cuda.memory._record_memory_history(enabled=None)
        with open(snap, "rb") as fi, gzip.open(snap + ".gz", "wb", compresslevel=9) as fo:
            shutil.copyfileobj(fi, fo)
        os.remove(snap)
    raw = os.path.join(tmp, "trace.json")
    prof.export_chrome_trace(raw)
    from record_kineto import _finalize

    _finalize(raw, os.path.join(out_dir, f"{name}.pt.trace.json.gz"), "gpu-host")
    shutil.rmtree(tmp, ignore_errors=True)
    del prof

    # per-step peaks (a second pass over the same steps: the peak of each step on its own)
    _reset(step)
    for i in range(BARE_WARMUP):
        step(i)
    _sync()
    peaks = []
    for i in range(ACTIVE):
        if DEV == "cuda":
            torch.cuda.reset_peak_memory_stats()
        step(BARE_WARMUP + i)
        _sync()
        if DEV == "cuda":
            peaks.append({"allocated_mib": torch.cuda.max_memory_allocated() / MB,
                          "reserved_mib": torch.cuda.max_memory_reserved() / MB})
    truth["per_step_peak_unprofiled"] = peaks

    # collection cost: bare, light profiler, light profiler + profile_memory (same steps)
    timing = {}
    for label, kw in (("bare", None), ("light", dict(profile_memory=False)), ("light_memory", dict(profile_memory=True))):
        _reset(step)
        for i in range(BARE_WARMUP):
            step(i)
        if kw is None:
            med, all_ = _timed(step, TIMED)
        else:
            with profile(activities=_acts(), record_shapes=False, with_stack=False, **kw) as p:
                med, all_ = _timed(step, TIMED, p)
            del p
        timing[label] = {"median_ms": med, "steps_ms": all_}
    timing["profile_memory_over_light"] = round(timing["light_memory"]["median_ms"] / timing["light"]["median_ms"], 4)
    timing["profile_memory_over_bare"] = round(timing["light_memory"]["median_ms"] / timing["bare"]["median_ms"], 4)
    truth["timing"] = timing
    _reset(step)
    return truth


def main():
    global DEV, SMALL
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--snapshot", action="append", default=[])
    ap.add_argument("--program", help="run the bare loop of one workload (for `proflab run`)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    a = ap.parse_args()
    if a.dry_run or not torch.cuda.is_available():
        DEV, SMALL = "cpu", True
    if a.program:
        step = WORKLOADS[a.program][0]()
        for i in range(a.steps):
            step(i)
        _sync()
        return
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "ground_truth.json")
    gt = json.load(open(path)) if os.path.exists(path) else {}
    gt["_env"] = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
                  "device": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu"}
    for name in a.only or WORKLOADS:
        t0 = time.perf_counter()
        gt[name] = record(name, a.out, snapshot=name in a.snapshot)
        gt[name]["record_s"] = round(time.perf_counter() - t0, 2)
        print(name, json.dumps({k: v for k, v in gt[name].items() if not isinstance(v, (list, dict))}), flush=True)
        print("  timing", {k: v if not isinstance(v, dict) else v["median_ms"] for k, v in gt[name]["timing"].items()}, flush=True)
        with open(path, "w") as fh:
            json.dump(gt, fh, indent=1)


if __name__ == "__main__":
    main()
