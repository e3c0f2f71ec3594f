"""Names for display, shared by the analysis and the renderers (no polars: the renderers
load without the table stack)."""

from __future__ import annotations

import re

__all__ = ["allocation_label", "kernel_label"]

_NAMESPACES = re.compile(r"\b(?:at::native::|at::cuda::|c10::|std::|cub::|cutlass::|\(anonymous namespace\)::|void\s+)")


def kernel_label(name: str | None) -> str:
    """A kernel name cut to what tells kernels apart: no return type, namespaces or
    parameter list (``void at::native::vectorized_elementwise_kernel<4, at::native::sin_kernel_cuda...>(int, ...)``
    becomes ``vectorized_elementwise_kernel<4, sin_kernel_cuda...>``)."""
    if not name:
        return "-"
    text = " ".join(str(name).split())
    if text.endswith(")") and "(" in text:
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(text[i], 0)
            if depth == 0:
                if i > 0 and not text[:i].endswith(("operator", " ")):
                    text = text[:i]
                break
    return _NAMESPACES.sub("", text).strip() or str(name)


def allocation_label(r: dict) -> str:
    """Who made a live allocation (a row of the memory analysis): the operator, the autograd
    node or range it ran in, its module and source line, where the trace has them."""
    who = r.get("op") or "?"
    if r.get("within"):
        who += f" in {r['within']}"
    if r.get("module"):
        who += f" ({r['module']})"
    if r.get("source"):
        who += f" at {r['source']}"
    return who
