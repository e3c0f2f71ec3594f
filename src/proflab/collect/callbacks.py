"""ProfCallback: torch.profiler inside a PyTorch Lightning or Hugging Face Trainer loop (seed 002).

One profiling core, two thin adapters. The core runs ``torch.profiler`` with
``schedule(wait, warmup, active)``, steps it after every training batch, and when the window
closes writes, into ``out_dir``:

``key_averages.txt``        operators by self CUDA time (CPU without CUDA): the kernels to
                            hand to ncu
``trace.pt.trace.json.gz``  the trace (``proflab analyze`` reads it)
``memory_timeline.html``    with ``profile_memory`` (and CUDA): memory by category over time
``stacks_cuda.txt`` / ``stacks_cpu.txt``  with ``with_stack``: flame-graph stacks

An artifact that fails is skipped with a warning; the training goes on. Lightning and
transformers are imported only when a callback for them is made.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

__all__ = ["ProfCallback", "ProfilingCore"]


class ProfilingCore:
    """The framework-free part: ``start()``, ``step()`` after each batch, ``stop()``."""

    def __init__(self, out_dir: str | Path = "prof", *, wait: int = 1, warmup: int = 1, active: int = 3,
                 record_shapes: bool = True, with_stack: bool = True, profile_memory: bool = True) -> None:  # fmt: skip
        self.out_dir = Path(out_dir)
        self.wait, self.warmup, self.active = wait, warmup, active
        self.opts = {"record_shapes": record_shapes, "with_stack": with_stack, "profile_memory": profile_memory}
        self.prof = None
        self.written: list[Path] = []

    def start(self) -> None:
        import torch

        tp = torch.profiler
        self.cuda = torch.cuda.is_available()
        acts = [tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if self.cuda else [])
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.prof = tp.profile(
            activities=acts,
            schedule=tp.schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
            on_trace_ready=self._write,
            **self.opts,
        )
        self.prof.start()

    def step(self) -> None:
        if self.prof is not None:
            self.prof.step()

    def stop(self) -> None:
        prof, self.prof = self.prof, None
        if prof is not None:
            prof.stop()

    def _artifact(self, name: str, write) -> None:
        path = self.out_dir / name
        # written in a side folder, then renamed: a write cut short never leaves half a file
        # under the final name; the file name is kept, as torch picks the format from it (.gz)
        partial = self.out_dir / f".partial-{os.getpid()}"
        try:
            partial.mkdir(parents=True, exist_ok=True)
            write(str(partial / name))
            os.replace(partial / name, path)
            self.written.append(path)
        except Exception as e:
            warnings.warn(f"ProfCallback: {name} not written: {type(e).__name__}: {e}", stacklevel=2)
        finally:
            shutil.rmtree(partial, ignore_errors=True)

    def _write(self, prof) -> None:
        # self time: with_stack adds Python frames, whose total time would crowd out the ops
        sort = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"

        def table(path):
            Path(path).write_text(prof.key_averages().table(sort_by=sort, row_limit=50) + "\n", encoding="utf-8")

        self._artifact("key_averages.txt", table)
        self._artifact("trace.pt.trace.json.gz", prof.export_chrome_trace)
        if self.opts["profile_memory"] and self.cuda:
            self._artifact("memory_timeline.html", lambda p: prof.export_memory_timeline(p, device="cuda:0"))
        if self.opts["with_stack"]:
            metric = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"
            name = "stacks_cuda.txt" if self.cuda else "stacks_cpu.txt"
            self._artifact(name, lambda p: prof.export_stacks(p, metric))


def _lightning_base():
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback  # the older package name
    return Callback


def _hf_base():
    from transformers import TrainerCallback

    return TrainerCallback


_CLASSES: dict[str, type] = {}


def _adapter(framework: str) -> type:
    if framework in _CLASSES:
        return _CLASSES[framework]
    if framework == "lightning":
        base = _lightning_base()

        class LightningProfCallback(ProfCallback, base):
            def on_train_start(self, trainer, pl_module):
                self.core.start()

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                self.core.step()

            def on_train_end(self, trainer, pl_module):
                self.core.stop()

            def on_exception(self, trainer, pl_module, exception):
                self.core.stop()  # keep what the window recorded before training failed

        cls = LightningProfCallback
    else:
        base = _hf_base()

        class HFProfCallback(ProfCallback, base):
            def on_train_begin(self, args, state, control, **kwargs):
                self.core.start()

            def on_step_end(self, args, state, control, **kwargs):
                self.core.step()

            def on_train_end(self, args, state, control, **kwargs):
                self.core.stop()

        cls = HFProfCallback
    _CLASSES[framework] = cls
    return cls


def _detect() -> str:
    import sys

    have = [f for f, mods in (("lightning", ("lightning", "pytorch_lightning")), ("hf", ("transformers",)))
            if any(m in sys.modules for m in mods)]  # fmt: skip
    if len(have) == 1:
        return have[0]
    from proflab.errors import UsageError

    if not have:
        raise UsageError("ProfCallback: import lightning (or pytorch_lightning) or transformers first, or pass framework=")
    raise UsageError("ProfCallback: both lightning and transformers are imported; pass framework='lightning' or 'hf'")


class ProfCallback:
    """``ProfCallback(out_dir, framework="auto", wait=1, warmup=1, active=3, ...)``: a callback
    for ``lightning.Trainer(callbacks=[...])`` or ``transformers.Trainer(callbacks=[...])``.
    ``framework``: "lightning", "hf" or "auto" (whichever of the two is imported). Options: see
    :class:`ProfilingCore`. ``enable_nsight_systems=True`` (seed 002) skips torch.profiler and
    emits NVTX ranges for an enclosing ``nsys profile`` instead (``torch.autograd.profiler.emit_nvtx``)."""

    def __new__(cls, *args, framework: str = "auto", **kwargs):
        if cls is not ProfCallback:
            return super().__new__(cls)
        if framework == "auto":
            framework = _detect()
        if framework not in ("lightning", "hf"):
            from proflab.errors import UsageError

            raise UsageError(f"ProfCallback: framework must be 'lightning', 'hf' or 'auto', not {framework!r}")
        return super().__new__(_adapter(framework))

    def __init__(self, out_dir: str | Path = "prof", *, framework: str = "auto",
                 enable_nsight_systems: bool = False, **kwargs: Any) -> None:  # fmt: skip
        self.core = _NvtxCore() if enable_nsight_systems else ProfilingCore(out_dir, **kwargs)


class _NvtxCore:
    """seed 002's nsys mode: NVTX ranges per op (emit_nvtx) for an enclosing nsys capture."""

    def __init__(self) -> None:
        self._ctx = None

    def start(self) -> None:
        import torch

        if "NSYS_PROFILING_SESSION_ID" not in os.environ and not os.environ.get("PROFLAB_RUN_CONFIG"):
            warnings.warn("ProfCallback(enable_nsight_systems=True) outside nsys: NVTX ranges go nowhere", stacklevel=2)
        self._ctx = torch.autograd.profiler.emit_nvtx(record_shapes=True)
        self._ctx.__enter__()

    def step(self) -> None:
        pass

    def stop(self) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.__exit__(None, None, None)
