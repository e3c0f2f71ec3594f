"""What ``proflab run`` records unless told otherwise: read by :class:`launcher.RunOptions`
and by the command line's options, without importing the launcher (its imports, the
subprocess and run-directory machinery, cost every other command 20-30 ms, ``--help`` too)."""

from __future__ import annotations

__all__ = ["COUNT_FLOPS", "RECORD_SHAPES", "WITH_STACK"]

# Off: recording them adds to the profiler's cost (measured on realistic H100 loops:
# tests/data/realistic/README.md). The FLOPs, MFU and TFLOPS/W come from one unprofiled
# step counted by torch.utils.flop_counter instead (COUNT_FLOPS); shapes give more (each
# operator's FLOPs and bytes against its roof), at that cost.
RECORD_SHAPES = False
WITH_STACK = False
# On: one step outside the window runs under torch.utils.flop_counter (collect/_child.py)
COUNT_FLOPS = True
