"""What ``proflab run``'s runtime reads of a program's own work without changing it: one step's
FLOPs (``FlopCount``) and torch.compile's own record of what it compiled (``compile_record``).
Standard library only, like ``_child.py``, which loads this file by path.

Observing must not change the program. ``torch.utils.flop_counter.FlopCounterMode`` does: it is
a ``TorchDispatchMode``, and Dynamo skips every frame it meets while such a mode is active, and
remembers the skip on the code object, so a compiled function called once inside the counted
step runs eager for the rest of the process (on a compiled MLP under torch 2.13, the trace
then held ``AddmmBackward0`` instead of ``CompiledFunction``; on nanoGPT the bare step went
from ~10.6 to ~13.9 ms, the eager step). Its module tracker installs global module hooks as
well, which a compiled module's guards see (a recompile) and which torch warns about.

So the count here is a dispatch mode of our own that says ``ignore_compile_internals``: Dynamo
compiles and runs compiled code as it would without it, and the mode sees the operators the
compiled code still calls (the matrix products, convolutions and attention Inductor hands to
their libraries), whose FLOPs are the model FLOPs: on the compiled MLP the count equals the
eager one. Work inside a CUDA graph replay is not dispatched and cannot be counted this way;
the analysis says so when the trace replays graphs. Module attribution (global module hooks)
is kept only where Dynamo has compiled nothing. A torch whose dispatch modes cannot opt out of
compiled code counts nothing once Dynamo has compiled, and says why.
"""

from __future__ import annotations

import sys
import threading
import time

_FLOP_MODULES = 50  # modules kept in the FLOP count (the largest, at most three levels deep)
_FLOP_MODULE_DEPTH = 3
_REASONS = 20  # graph-break reasons, recompiles and compiles kept in the record
_REASON_CHARS = 600  # a reason is cut to this many characters


def _compiles() -> bool:
    """Whether torch.compile has compiled a frame in this process (Dynamo's own counters;
    Dynamo itself is loaded by any program that builds an optimizer, compiled or not)."""
    du = sys.modules.get("torch._dynamo.utils")
    frames = (getattr(du, "counters", None) or {}).get("frames") or {}
    return bool(frames.get("total"))


class CannotCount(Exception):
    """Counting would change the program: the reason, for the run's record."""


class FlopCount:
    """One step's FLOPs under a dispatch mode entered at one step's end and left at the
    next's (on the training thread; autograd's threads inherit the mode). A formula that
    fails is caught and said, never raised into the program. Per operator, per dtype (of the
    operator's first tensor input) and, where Dynamo is not loaded, per module."""

    def __init__(self, torch) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.flop_counter import flop_registry

        opt_out = "ignore_compile_internals" in vars(TorchDispatchMode)
        if _compiles() and not opt_out:
            raise CannotCount(
                f"torch {torch.__version__}'s dispatch modes would turn torch.compile off for the code they run "
                "under (this torch has no ignore_compile_internals): FLOPs are not counted in a program that compiles"
            )
        self.errors: list[str] = []
        self.by_dtype: dict[str, int] = {}
        self.by_op: dict[str, int] = {}
        self.by_module: dict[str, int] = {}
        self.tracker = None
        if not _compiles():
            try:
                from torch.utils.module_tracker import ModuleTracker

                self.tracker = ModuleTracker()
            except ImportError:
                pass
        errors, by_dtype, by_op, by_module, tracker = self.errors, self.by_dtype, self.by_op, self.by_module, self.tracker
        tensor, hop = torch.Tensor, getattr(getattr(torch, "_ops", None), "HigherOrderOperator", ())

        class _FlopMode(TorchDispatchMode):
            @classmethod
            def ignore_compile_internals(cls) -> bool:
                return True  # compiled code compiles and runs as it does without us

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if isinstance(func, hop):
                    return NotImplemented  # as FlopCounterMode does for the ones it does not model
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                packet = func._overloadpacket
                formula = flop_registry.get(packet)
                if formula is None:
                    return out
                try:
                    n = int(formula(*args, **kwargs, out_val=out))
                    name = str(packet)
                    by_op[name] = by_op.get(name, 0) + n
                    dt = next((str(a.dtype) for a in args if isinstance(a, tensor)), "unknown")
                    by_dtype[dt] = by_dtype.get(dt, 0) + n
                    if tracker is not None:
                        for m in set(tracker.parents):
                            by_module[m] = by_module.get(m, 0) + n
                except Exception as e:  # the program's call goes on, uncounted
                    if len(errors) < 5:
                        errors.append(f"{packet}: {type(e).__name__}: {e}")
                return out

        self.mode = _FlopMode()
        self.thread = threading.get_ident()
        self.t0 = time.perf_counter()
        if self.tracker is not None:
            self.tracker.__enter__()
        self.mode.__enter__()

    def _leave(self) -> None:
        try:
            self.mode.__exit__(None, None, None)
        finally:
            if self.tracker is not None:
                self.tracker.__exit__(None, None, None)

    def stop(self, torch, step: int) -> dict:
        """Leave the mode (on the thread that entered it) and return the record."""
        if threading.get_ident() != self.thread:
            raise RuntimeError("the step ended on another thread than it began on")
        self._leave()
        modules = {m: n for m, n in self.by_module.items() if m != "Global" and m.count(".") < _FLOP_MODULE_DEPTH}
        try:
            tf32 = torch.get_float32_matmul_precision() != "highest"
        except Exception:
            tf32 = None
        return {
            "source": "torch.utils.flop_counter formulas, one unprofiled step",
            "step": step,
            "total": sum(self.by_op.values()),
            "by_op": dict(sorted(self.by_op.items(), key=lambda kv: -kv[1])),
            "by_dtype": dict(sorted(self.by_dtype.items(), key=lambda kv: -kv[1])),
            "by_module": dict(sorted(modules.items(), key=lambda kv: -kv[1])[:_FLOP_MODULES]),
            "by_module_missing": None if self.tracker is not None else (
                "module attribution needs global module hooks, which a compiled module's guards see; left out "
                "in a program that compiles"),
            "compiled": _compiles(),
            "matmul_tf32": tf32,
            "counted_step_s": round(time.perf_counter() - self.t0, 4),
            "errors": self.errors,
        }

    def abandon(self) -> None:
        """The program ends inside the counted step: leave the mode, keep nothing."""
        try:
            if threading.get_ident() == self.thread:
                self._leave()
        except Exception:
            pass


def _cut(text) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= _REASON_CHARS else s[: _REASON_CHARS - 1] + "…"


def _short_reason(text: str) -> str:
    """A graph break's reason as Dynamo words it has an explanation, hints and a developer
    context after its first line: the first line is the reason."""
    return _cut(str(text).strip().splitlines()[0] if str(text).strip() else text)


def compile_record() -> dict | None:
    """What torch.compile did in this process, from Dynamo's own counters and compilation
    metrics (read, never reset or configured): the frames it compiled, graph breaks with their
    reasons and lines, recompiles with the guard that failed, and CUDA graph skips with their
    reason. None where Dynamo compiled nothing (the program does not compile)."""
    if not _compiles():
        return None
    try:
        from torch._dynamo import utils as du
    except Exception as e:
        return {"missing": f"reading torch._dynamo failed: {type(e).__name__}: {e}"}
    counters = getattr(du, "counters", {}) or {}
    frames = {k: int(v) for k, v in (counters.get("frames") or {}).items()}
    stats = {k: int(v) for k, v in (counters.get("stats") or {}).items()}
    breaks: dict[str, dict] = {}
    for reason, n in (counters.get("graph_break") or {}).items():
        b = breaks.setdefault(_short_reason(reason), {"reason": _short_reason(reason), "count": 0, "lines": []})
        b["count"] += int(n)
    # where each graph break happened: the user frame Dynamo broke in (graph_break_reasons)
    for r in list(getattr(du, "graph_break_reasons", []) or [])[-200:]:
        reason = _short_reason(getattr(r, "reason", ""))
        stack = getattr(r, "user_stack", None) or []
        if not stack:
            continue
        fs = stack[-1]
        line = f"{getattr(fs, 'filename', '?')}:{getattr(fs, 'lineno', '?')}"
        b = breaks.setdefault(reason, {"reason": reason, "count": 0, "lines": []})
        if line not in b["lines"] and len(b["lines"]) < 5:
            b["lines"].append(line)
    compiles, recompiles, skips = [], [], []
    try:
        metrics = du.get_compilation_metrics()
    except Exception:
        metrics = []
    for m in metrics:
        frame = f"{getattr(m, 'co_name', None)} ({getattr(m, 'co_filename', None)}:{getattr(m, 'co_firstlineno', None)})"
        c = {
            "compile_id": getattr(m, "compile_id", None),
            "frame": frame,
            "graph_ops": getattr(m, "graph_op_count", None),
            "graph_breaks": getattr(m, "num_graph_breaks", None),
            "compile_s": getattr(m, "entire_frame_compile_time_s", None),
            "failed": _cut(m.fail_reason) if getattr(m, "fail_reason", None) else None,
        }
        compiles.append(c)
        if getattr(m, "recompile_reason", None):
            recompiles.append({"frame": frame, "compile_id": c["compile_id"], "reason": _cut(m.recompile_reason)})
        if getattr(m, "cudagraph_skip_reason", None):
            skips.append({"frame": frame, "compile_id": c["compile_id"], "reason": _cut(m.cudagraph_skip_reason)})
    inductor = counters.get("inductor") or {}
    return {
        "source": "torch._dynamo counters and compilation metrics, read as the process ended",
        "frames": frames,
        "unique_graphs": stats.get("unique_graphs"),
        "compiles": compiles[-_REASONS:],
        "compile_count": len(compiles),
        "graph_breaks": sorted(breaks.values(), key=lambda b: -b["count"])[:_REASONS],
        "graph_break_count": sum(b["count"] for b in breaks.values()),
        "recompiles": recompiles[-_REASONS:],
        "recompile_count": len(recompiles),
        "cudagraph_skips": skips[-_REASONS:],
        "cudagraph_skip_count": int(inductor.get("cudagraph_skips", 0) or 0),
    }
