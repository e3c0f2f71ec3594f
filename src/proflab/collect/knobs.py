"""The fixes ``proflab try`` makes without code changes: knobs.

A knob is set in the program's process by proflab's runtime once the program imports torch
(``_child.py``: torch settings, and the defaults of the DataLoader, optimizer and DDP
constructors the program calls afterwards), or by its environment (the allocator, NCCL). The
program's own explicit setting after that wins where the knob is a torch setting (a program
that sets ``allow_tf32`` itself each step keeps its own); a constructor argument the knob sets
overrides the program's.

Names (``proflab try NAME[=VALUE] ...``):

``tf32``                   FP32 matmuls and convolutions on TF32 tensor cores
``matmul-precision=P``     ``torch.set_float32_matmul_precision(P)`` (highest, high, medium)
``cudnn-benchmark``        ``torch.backends.cudnn.benchmark = True``
``workers=N``              ``DataLoader(num_workers=N)``
``pin-memory``             ``DataLoader(pin_memory=True)``
``persistent-workers``     ``DataLoader(persistent_workers=True)`` (with workers)
``prefetch=N``             ``DataLoader(prefetch_factor=N)`` (with workers)
``compile-mode=M``         ``torch.compile(..., mode=M)`` for every compile the program makes
                           (``reduce-overhead``: CUDA graphs of the compiled regions;
                           ``max-autotune``, ``max-autotune-no-cudagraphs``, ``default``)
``foreach-optimizer``      optimizers built with ``foreach=True``
``fused-optimizer``        optimizers built with ``fused=True`` (Adam, AdamW, SGD, ...)
``expandable-segments``    ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
``ddp-bucket-mb=N``        ``DistributedDataParallel(bucket_cap_mb=N)``
``ddp-grad-view``          ``DistributedDataParallel(gradient_as_bucket_view=True)``
``ddp-bf16-hook``          DDP's bf16 gradient compression hook
``nccl:NAME=VALUE``        ``NCCL_NAME=VALUE`` in the environment
``env:NAME=VALUE``         ``NAME=VALUE`` in the environment
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proflab.errors import UsageError

__all__ = ["Knob", "parse", "KNOBS", "environment", "runtime_settings"]

# name: (takes a value, what it does); the runtime reads the same names (_child.py)
KNOBS: dict[str, tuple[str | None, str]] = {
    "tf32": (None, "FP32 matmuls and convolutions on TF32 tensor cores"),
    "matmul-precision": ("highest|high|medium", "torch.set_float32_matmul_precision"),
    "cudnn-benchmark": (None, "torch.backends.cudnn.benchmark = True"),
    "workers": ("N", "DataLoader(num_workers=N)"),
    "pin-memory": (None, "DataLoader(pin_memory=True)"),
    "persistent-workers": (None, "DataLoader(persistent_workers=True)"),
    "prefetch": ("N", "DataLoader(prefetch_factor=N)"),
    "compile-mode": ("reduce-overhead|max-autotune|max-autotune-no-cudagraphs|default", "torch.compile(..., mode=M)"),
    "foreach-optimizer": (None, "optimizers with foreach=True"),
    "fused-optimizer": (None, "optimizers with fused=True"),
    "expandable-segments": (None, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    "ddp-bucket-mb": ("N", "DistributedDataParallel(bucket_cap_mb=N)"),
    "ddp-grad-view": (None, "DistributedDataParallel(gradient_as_bucket_view=True)"),
    "ddp-bf16-hook": (None, "DDP's bf16 gradient compression hook"),
}
_ENV = re.compile(r"^(nccl|env):([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


@dataclass(frozen=True)
class Knob:
    name: str
    value: str | None = None

    def __str__(self) -> str:
        return self.name if self.value is None else f"{self.name}={self.value}"


def parse(text: str) -> Knob:
    """One knob from its command-line form; a UsageError names what is wrong with it."""
    m = _ENV.match(text)
    if m:
        kind, name, value = m.groups()
        return Knob(f"{kind}:{name}", value)
    name, _, value = text.partition("=")
    if name not in KNOBS:
        raise UsageError(f"unknown fix {text!r}; choose from {', '.join(KNOBS)}, nccl:NAME=VALUE, env:NAME=VALUE")
    wants, _ = KNOBS[name]
    if wants is None and value:
        raise UsageError(f"{name} takes no value")
    if wants is not None:
        if not value:
            raise UsageError(f"{name} needs a value: {name}={wants.split('|')[0]}")
        if wants == "N" and not value.isdigit():
            raise UsageError(f"{name}={value}: expected a whole number")
        if "|" in wants and value not in wants.split("|"):
            raise UsageError(f"{name}={value}: expected one of {wants.replace('|', ', ')}")
    return Knob(name, value or None)


def environment(knobs: list[Knob], env: dict[str, str]) -> dict[str, str]:
    """``env`` with the knobs that act through the environment set."""
    out = dict(env)
    for k in knobs:
        if k.name == "expandable-segments":
            conf = [c for c in out.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",") if c and not c.startswith("expandable_segments")]
            out["PYTORCH_CUDA_ALLOC_CONF"] = ",".join([*conf, "expandable_segments:True"])
        elif k.name.startswith("nccl:"):
            name = k.name[5:]
            out[name if name.startswith("NCCL_") else f"NCCL_{name}"] = k.value or ""
        elif k.name.startswith("env:"):
            out[k.name[4:]] = k.value or ""
    return out


def runtime_settings(knobs: list[Knob]) -> dict[str, str | None]:
    """The knobs the runtime sets inside the program (its config's ``knobs``)."""
    return {k.name: k.value for k in knobs if k.name in KNOBS and k.name != "expandable-segments"}
