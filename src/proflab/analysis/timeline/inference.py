"""LLM inference: a generation loop's forwards, phases, latency, bandwidth and KV cache.

A trace of a generation loop (Hugging Face ``generate()``, a hand-written decode loop, a
serving engine's model runner) runs the model's forward once per output token. The forwards
are found from what the trace records:

- **Forward ends.** The top module's forward where the trace records module ranges (``with_stack``:
  the ``nn.Module: <Class>_<n>`` ranges, one per call): the outermost module on the loop's thread
  whose calls hold the LM heads, one each (``LlamaForCausalLM`` in Hugging Face's ``generate()``,
  which calls it once per token); its end closes the forward, the work after the LM head (the
  logits' cast, the cache's update) included. Otherwise the LM head: the GEMM (``aten::linear``, else ``aten::addmm``/``aten::mm``)
  with the widest output (the vocabulary), once per forward; its host end closes the forward.
  Needs the operators' input shapes (``record_shapes=True``).
- **Phases.** From named ranges where the program or its engine names them (``PHASE_RANGES``:
  ``prefill``/``decode`` as words, TensorRT-LLM's context and generation phases: a forward whose
  token comes inside one takes its phase; Hugging Face's ``generate()`` names none, and vLLM's
  ranges name the model runner's stages, not phases), otherwise from the attention's shapes
  (``aten::scaled_dot_product_attention`` and the flash/efficient kernels' operators: query
  ``[batch, heads, q, head_dim]``, key and value ``[batch, kv_heads, kv, head_dim]``): the first
  forward of a sequence is its prefill; a forward
  of query length 1 is a decode; a forward whose query is the whole context, one longer than the
  forward before it, is a decode that recomputed its context (no KV cache: ``recompute``). Without
  attention shapes (a serving engine's own attention operator) the GEMMs' rows computed per row
  produced stand for the query length. A decode run compiled (a static cache with torch.compile)
  shows no operators: each outermost compiled region is then one forward.
- **Tokens as steps.** A trace without profiler steps (no ``proflab.step()``, no ``prof.step()``)
  that holds a generation loop takes its forwards as its steps (``token_steps``): a token a step,
  so the step table, the observer model and the what-if replay of the decode fixes run per token.
- **Latency** (measured, on the trace's clock, ms): each forward's token is out when the host
  holds it: at the first call after the forward that waits for the GPU (the sampled token's
  ``.item()``, the EOS check, a streamer's copy; ``_token_out``), else when the forward's host
  work ends and the GPU work it launched has run. TTFT is the generation's start (its first
  operator) to the first token; the **time per output token** is NVIDIA's TPOT (GenAI-Perf):
  (last token - first token) / (tokens - 1), which is also the mean of vLLM's inter-token
  latencies (ITL: each gap between consecutive tokens), whose median and p90 are given too;
  the end-to-end time is the start to the last token; tokens/s counts every sequence of the
  batch. These are the profiled program's times (``timing: "profiled"``): the profiler's own cost
  is in them. Beside them, the unprofiled TTFT and inter-token gap are estimated as a range (the
  profiler's per-event cost, measured from the trace's gaps, ``event_cost``, taken off each
  forward), and where the tokens are the trace's steps their central figures come from the
  what-if replay of the bare plan (``replayed_latency``): on a CPU, whose operators cost the
  profiler less than the GPU programs the model was calibrated on, the range's low end can
  undershoot (tests/data/inference: bare 0.62 ms, estimated 0.58).
- **Utilisation** (derived from shapes): a decode forward reads every weight the GEMMs use and
  the KV cache the attention reads; bytes per token over the time per output token is the
  achieved bandwidth, over the device's HBM peak (``analysis.devices``) the model bandwidth
  utilisation (MBU, Databricks' definition). Prefill's MFU: the GEMMs' and attention's FLOPs
  (2·M·N·K; 4·b·h·q·kv·d for attention, not halved for a causal mask) over the prefill
  forward's time and the matrix peak for its dtype.
- **Memory** (derived): the KV cache's bytes (key and value of every layer at the last
  forward's context) and its growth per token.

What a trace lacks is said (``missing``), never guessed: without shapes there are no forwards;
without GPU work no GPU time per forward; without a known device no MBU or MFU.

Profiling a serving engine: vLLM writes torch.profiler traces where ``VLLM_TORCH_PROFILER_DIR``
points (start and stop with ``POST /start_profile`` and ``/stop_profile``, or the benchmark's
``--profile``): ``proflab analyze DIR`` reads the ``*.pt.trace.json.gz`` files there. TensorRT-LLM
marks its iterations with NVTX: profile it with Nsight Systems, capturing only the iterations
``TLLM_PROFILE_START_STOP=A-B`` names (``nsys profile -c cudaProfilerApi --cuda-graph-trace node``,
so that the graph-replayed decode shows its kernels), then ``proflab analyze`` the export.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from proflab.analysis.devices import datasheet_peaks
from proflab.analysis.timeline.compiled import region_spans
from proflab.analysis.timeline.gaps import blocking_calls
from proflab.analysis.timeline.launch import SHORT_KERNEL_NS
from proflab.analysis.timeline.event_cost import cost_at
from proflab.analysis.timeline.event_cost import measure as measure_event_cost
from proflab.analysis.timeline.event_cost import startup as measure_startup
from proflab.analysis.timeline.observer import EVENT_COST_US, FLOOR_OP_US, PYTHON_COST_US
from proflab.model import Trace

__all__ = ["Inference", "inference_view", "recompute_cost", "token_steps", "ATTENTION_OPS", "PHASE_RANGES"]

# attention operators whose inputs are (query, key, value, ...), most specific last: the first
# name the trace has is read, so a composite op and the kernel op under it are not both counted
ATTENTION_OPS = ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
                 "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
                 "aten::_flash_attention_forward", "aten::_efficient_attention_forward")  # fmt: skip
# named ranges that say a phase (a program's own, an engine's; TensorRT-LLM calls prefill the context
# phase and decode the generation phase). Bare "context" or "generation" say too little to count
PHASE_RANGES = {"prefill": r"(?i)(?:^|[^a-z])prefill|context[_ ]phase", "decode": r"(?i)(?:^|[^a-z])decode|generation[_ ]phase"}
_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
          "signed char": 1, "unsigned char": 1}  # fmt: skip
_PEAK_DTYPE = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "c10::Float8_e4m3fn": "fp8"}
_DIMS = pl.List(pl.List(pl.Int64))
_SHAPED_OPS = ("aten::linear", "aten::addmm", "aten::mm", *ATTENTION_OPS)  # the operators read by name (``_shaped``)


@dataclass(frozen=True)
class Inference:
    """A generation loop as the trace shows it. ``forwards``: one row per forward (``index``,
    ``generation``, ``phase``, ``recompute``, ``batch``, ``q_len``, ``kv_len``, ``layers``,
    ``start_ns``, ``end_ns`` (the token's time), ``host_ms``, ``gpu_ms`` (summed kernel time it
    launched), ``interval_ms`` (since the token before), ``weight_bytes``, ``kv_bytes``, ``flops``,
    ``gemm_flops``, ``att_flops``, ``shaped_ms`` (host time in its GEMMs and attention), ``op_ms`` and
    ``top_ops`` (its outermost operators' host time and count), ``events`` and ``py_events`` (host
    events the profiler recorded in it), ``startup_ms`` (the profiler's start-up cost in it,
    ``event_cost.startup``: on the forward that made the trace's first CUDA call), ``kernels``,
    ``att_mask`` (its attention took a mask tensor: null where the attention operator's inputs
    do not say)). ``latency``, ``utilisation`` and
    ``memory`` are the report's figures (units in their names); ``missing`` what the trace lacks."""

    forwards: pl.DataFrame
    latency: dict[str, Any] = field(default_factory=dict)
    utilisation: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    phases_from: str = "none"
    forwards_from: str = "none"  # "top module <Class>" (its nn.Module ranges) or "LM head"
    tokens_as_steps: bool = False  # the trace had no steps: its forwards are its steps (token_steps)
    dtype: str | None = None
    kernel_floor_ns: float | None = None  # the least a kernel takes in this trace (its 5th percentile, at most 5 us)
    missing: tuple[str, ...] = ()
    event_cost_us: tuple[float, float] = EVENT_COST_US  # the profiler's cost per recorded event (``event_cost``)

    @property
    def found(self) -> bool:
        """The trace shows a generation loop (``_generating``)."""
        return _generating(self.forwards)

    def phase(self, name: str) -> pl.DataFrame:
        return self.forwards.filter(pl.col("phase") == name)

    def to_dict(self) -> dict[str, Any]:
        f = self.forwards
        counts = {p: int((f["phase"] == p).sum()) for p in ("prefill", "decode")} if f.height else {"prefill": 0, "decode": 0}
        return {
            "forwards": f.height,
            "generations": int(f["generation"].n_unique()) if f.height else 0,
            "phases": counts,
            "phases_from": self.phases_from,
            "forwards_from": self.forwards_from,
            "tokens_as_steps": self.tokens_as_steps,
            "recomputed_forwards": int(f["recompute"].sum()) if f.height else 0,
            "dtype": self.dtype,
            "latency": self.latency,
            "utilisation": self.utilisation,
            "memory": self.memory,
            "per_forward": [
                {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k not in ("start_ns", "end_ns")}
                for r in f.head(_PER_FORWARD).iter_rows(named=True)
            ],
            "missing": list(self.missing),
        }


_PER_FORWARD = 64  # rows of the per-forward table a report carries


def _shaped(cpu: pl.DataFrame, names: tuple[str, ...]) -> pl.DataFrame:
    """The first of ``names`` the trace has with input shapes, its dims decoded."""
    for n in names:
        # only lists of integer lists decode as shapes: a damaged or hostile trace's other values
        # (strings, deeper nesting) are left out rather than fail the report
        r = cpu.filter(pl.col("name") == n)  # (the pattern is matched on its few rows only)
        r = r.filter(pl.col("input_dims").str.contains(r"^\[(?:\[[0-9,]*\],?)*\]$"))
        if r.height:
            # the outermost call only: autocast re-dispatches an operator inside itself (aten::linear
            # within aten::linear), and the inner call is the same GEMM
            end = pl.col("start_ns") + pl.col("dur_ns")
            r = r.sort("tid", "start_ns").filter(pl.col("start_ns") >= end.cum_max().shift(1).over("tid").fill_null(-1))
            return r.with_columns(pl.col("input_dims").str.json_decode(_DIMS).alias("dims"))
    return cpu.clear().with_columns(pl.lit(None, _DIMS).alias("dims"))


def _gemms(cpu: pl.DataFrame) -> pl.DataFrame:
    """Weight GEMMs with (m, n, k) and the weight's element count. ``aten::linear`` where the trace
    has it (its ``mm``/``addmm`` children are then not counted again), else ``addmm``/``mm``."""
    lin = _shaped(cpu, ("aten::linear",))
    if lin.height:
        x, w = pl.col("dims").list.get(0), pl.col("dims").list.get(1)
        # m: the product of the input's leading dims
        m = x.list.slice(0, x.list.len() - 1).list.eval(pl.element().product()).list.first()
        return lin.with_columns(m.alias("m"), w.list.get(0).alias("n"), w.list.get(1).alias("k"))
    parts = []
    for name, a, b in (("aten::addmm", 1, 2), ("aten::mm", 0, 1)):
        r = _shaped(cpu, (name,))
        if r.height:
            d = pl.col("dims")
            parts.append(r.with_columns(d.list.get(a).list.get(0).alias("m"), d.list.get(b).list.get(1).alias("n"),
                                        d.list.get(b).list.get(0).alias("k")))
    return pl.concat(parts) if parts else lin.with_columns(*(pl.lit(None, pl.Int64).alias(c) for c in "mnk"))


def _rising(s: pl.Series) -> bool:
    """Whether ``s`` strictly rises (no nulls, no ties): then sorting it changes nothing,
    however the sort orders ties."""
    if s.null_count():
        return False
    v = s.to_numpy()
    return bool((v[1:] > v[:-1]).all())


def _elem_bytes(types: pl.Expr, i: int) -> pl.Expr:
    t = types.str.split(",").list.get(i, null_on_oob=True)
    return t.replace_strict(_BYTES, default=None, return_dtype=pl.Int64)


def _generating(f: pl.DataFrame) -> bool:
    """Forwards of a generation loop: a decode forward after a prefill (a training or scoring
    loop runs full-length forwards only: each its own prefill)."""
    if f.height < 2 or "phase" not in f.columns or not (f["phase"] == "decode").any():
        return False
    # forwards of one row per row produced and no context that grows: a model called in a loop
    # (an MLP's training step), not a model generating
    return bool((f["q_len"] > 1).any() or (f["kv_len"].diff() > 0).any())


def inference_view(trace: Trace, launches: pl.DataFrame, kernel_rows: pl.DataFrame | None = None,
                   regions: pl.DataFrame | None = None, event_cost_us: tuple[float, float] | None = None,
                   blocking: pl.DataFrame | None = None) -> Inference:
    """The generation loop in ``trace`` (see the module doc). ``launches``: host launch calls by
    correlation (``gaps.launch_calls``); ``kernel_rows``: the kernels with their launch
    (``kernels.kernel_rows``), for each forward's GPU time; by default the trace's own kernels
    (the analysis frees its kernel rows once their readers have what they need); ``regions``: the
    compiled ranges (``compiled.region_spans``) where already found; ``event_cost_us``: the
    profiler's cost per recorded event, low and high, which the unprofiled latency takes off (by
    default measured from the trace, ``event_cost.measure``, once a generation loop is found)."""
    missing: list[str] = []
    # (every report asks: a trace recorded without shapes, most of them, is told so before any copy)
    if trace.cpu.height and not trace.cpu.get_column("input_dims").is_not_null().any():
        return Inference(pl.DataFrame(), missing=(
            "the operators' input shapes (record_shapes=True): without them the forwards, their phases and "
            "the bytes they read are unknown",))
    # Only the operators read by name are copied (the GEMMs and attention): every host operator
    # copied with its texts cost the 514 MB trace 40 ms and 50 MiB, its shapes read by pattern 30 ms
    host = trace.cpu
    is_op = pl.col("cat").is_in(["cpu_op", "user_annotation"])
    any_op, any_shape = host.select(is_op.any().alias("op"), (is_op & pl.col("input_dims").is_not_null()).any().alias("shape")).row(0)
    if not any_op:
        return Inference(pl.DataFrame(), missing=("no host operators in the trace: forwards cannot be found",))
    if not any_shape:
        return Inference(pl.DataFrame(), missing=(
            "the operators' input shapes (record_shapes=True): without them the forwards, their phases and "
            "the bytes they read are unknown",))
    cpu = host.lazy().filter(is_op & pl.col("name").is_in(_SHAPED_OPS)).select(
        "name", "tid", "start_ns", "dur_ns", pl.col("input_types", "input_dims").cast(pl.String)).collect()
    g = _gemms(cpu)
    att = _shaped(cpu, ATTENTION_OPS)
    if g.height == 0:
        return Inference(pl.DataFrame(), missing=("no GEMM with input shapes: the LM head, hence the forwards, cannot be found",))
    # the LM head: the GEMM with the widest output, on the thread that runs the most GEMMs
    tid = g.group_by("tid").len().sort(["len", "tid"], descending=[True, False])["tid"][0]
    g = g.filter(pl.col("tid") == tid).sort("start_ns")
    vocab = int(g["n"].max())
    head = g.filter(pl.col("n") == vocab)
    head_ends = (head["start_ns"] + head["dur_ns"]).to_numpy()
    bounds, compiled_forwards = _with_compiled(trace if regions is None else regions, tid, head_ends)
    forwards_from = "LM head"
    if not compiled_forwards:
        top = _top_module(trace.cpu, tid, head_ends)
        if top is not None:
            forwards_from, bounds = f"top module {top[0]}", top[1]
    first_ns = int(host.select(pl.col("start_ns").filter(is_op & (pl.col("tid") == tid)).min()).item())
    n = len(bounds)
    if n < 2:
        return Inference(pl.DataFrame(), missing=(f"one LM head call (output width {vocab}) in the trace: no generation loop",))
    spans = region_spans(trace)[0] if regions is None else regions
    work = np.concatenate([g["start_ns"].to_numpy(), spans.filter(pl.col("tid") == tid)["start_ns"].to_numpy()])
    bounds = _token_out(bounds, blocking_calls(trace) if blocking is None else blocking, tid, work)

    def forward_of(t: pl.Series) -> np.ndarray:
        # a host time before the i-th head's end belongs to forward i; after the last, to none
        return np.searchsorted(bounds, t.to_numpy(), side="left")

    types = g["input_types"].drop_nulls()
    dtype = types.str.split(",").list.first().mode().sort()[0] if types.len() else None
    weight_elem = _elem_bytes(pl.col("input_types"), 1).fill_null(_BYTES.get(dtype or "", 0))
    g = g.with_columns(pl.Series("fw", forward_of(g["start_ns"])),
                       (pl.col("n") * pl.col("k") * weight_elem).alias("w_bytes"),
                       (2 * pl.col("m") * pl.col("n") * pl.col("k")).cast(pl.Float64).alias("flops"))
    per = g.filter(pl.col("fw") < n).group_by("fw").agg(
        pl.col("w_bytes").sum().alias("weight_bytes"), pl.col("flops").sum(), pl.col("dur_ns").sum().alias("shaped_ns"),
        # tokens the forward computed (its widest GEMM's rows) and tokens it produced (the LM head's)
        pl.col("m").max().alias("tokens_in"), pl.col("m").filter(pl.col("n") == vocab).last().alias("tokens_out"))
    frame = pl.DataFrame({"index": np.arange(n), "end_host_ns": bounds,
                          "start_ns": np.concatenate([[first_ns], bounds[:-1]])})
    frame = frame.join(per.rename({"fw": "index"}), on="index", how="left")
    if att.height:
        att = att.filter(pl.col("tid") == tid).with_columns(pl.Series("fw", forward_of(att.filter(pl.col("tid") == tid)["start_ns"])))
        q, k, v = (pl.col("dims").list.get(i) for i in range(3))
        eb = _elem_bytes(pl.col("input_types"), 1).fill_null(_BYTES.get(dtype or "", 0))
        kv_bytes = (k.list.eval(pl.element().product()).list.first() + v.list.eval(pl.element().product()).list.first()) * eb
        a = att.filter(pl.col("fw") < n).group_by("fw").agg(
            q.list.get(0).first().alias("batch"), q.list.get(-2).first().alias("q_len"), k.list.get(-2).first().alias("kv_len"),
            pl.len().alias("layers"), kv_bytes.sum().alias("kv_bytes"), pl.col("dur_ns").sum().alias("att_ns"),
            (4 * q.list.eval(pl.element().product()).list.first() * k.list.get(-2)).cast(pl.Float64).sum().alias("att_flops"),
            # aten::scaled_dot_product_attention(query, key, value, attn_mask, ...): a mask tensor given
            # (its shape; the other attention operators' inputs differ: unknown there)
            pl.when(pl.col("name") == "aten::scaled_dot_product_attention")
            .then(pl.col("dims").list.get(3, null_on_oob=True).list.len().fill_null(0) > 0).any().alias("att_mask"),
        )
        frame = frame.join(a.rename({"fw": "index"}), on="index", how="left").with_columns(
            pl.col("flops").alias("gemm_flops"), (pl.col("flops") + pl.col("att_flops").fill_null(0)).alias("flops"),
            (pl.col("shaped_ns") + pl.col("att_ns").fill_null(0)).alias("shaped_ns")).drop("att_ns")
        # Hugging Face's SDPA with an attention mask (a padded batch) and grouped KV heads folds the
        # query's head groups into its length ([b, kv_heads, groups * q, d]): a cached decode then
        # shows a query of `groups` rows. Its GEMMs still compute one row per row produced and its
        # context grows by one: that is a decode of one query position (tests/data/inference_padding)
        folded = ((pl.col("kv_len") - pl.col("kv_len").shift(1) == 1) & (pl.col("tokens_in") == pl.col("tokens_out"))
                  & (pl.col("q_len") > 1) & (pl.col("q_len") < pl.col("kv_len")))
        frame = frame.sort("index").with_columns(pl.when(folded.fill_null(False)).then(1).otherwise(pl.col("q_len")).alias("q_len"))
    else:
        missing.append("no attention operator with input shapes (scaled_dot_product_attention, flash/efficient "
                       "attention): phases from shapes, KV bytes and KV-cache size are unknown")
        # without attention shapes, the GEMMs tell the query length: rows computed per row produced (a
        # serving engine's packed batch: prompt tokens beside one token per decoding sequence)
        frame = frame.with_columns(pl.col("tokens_out").alias("batch"), (pl.col("tokens_in") // pl.col("tokens_out")).alias("q_len"),
                                   *(pl.lit(None, pl.Int64).alias(c) for c in ("kv_len", "layers", "kv_bytes")),
                                   pl.lit(None, pl.Boolean).alias("att_mask"),
                                   pl.col("flops").alias("gemm_flops"), pl.lit(None, pl.Float64).alias("att_flops"))
    frame = frame.sort("index")
    # Most traces with shapes are training or scoring loops: that their forwards make no
    # generation loop (``_generating``) is told from their shapes, before each forward's kernels,
    # events and host time are gathered (the 514 MB Kineto trace: 0.09 -> 0.02 s). Where the
    # program names its phases the named ranges decide, on the tokens' final times.
    early, early_from = _phases(frame.with_columns(pl.col("end_host_ns").alias("end_ns")), host)
    if early_from != "named ranges" and not _generating(early):
        return Inference(early, phases_from=early_from, forwards_from=forwards_from, dtype=dtype, missing=tuple(missing))
    # the GPU work each forward launched, and when it ended
    if kernel_rows is None and trace.has_gpu:
        kernel_rows = trace.gpu.select("kind", "correlation", "start_ns", "dur_ns").filter(pl.col("kind") == "kernel")
    if kernel_rows is not None and kernel_rows.height and launches.height:
        kr = kernel_rows.select("correlation", "start_ns", "dur_ns").join(
            launches.select("correlation", "launch_start_ns"), on="correlation", how="inner")
        kr = kr.with_columns(pl.Series("fw", forward_of(kr["launch_start_ns"])))
        gk = kr.filter(pl.col("fw") < n).group_by("fw").agg(pl.col("dur_ns").sum().alias("gpu_ns"), pl.len().alias("kernels"),
                                                           (pl.col("start_ns") + pl.col("dur_ns")).max().alias("gpu_end_ns"))
        # what a kernel takes at least here: the trace's shortest kernels, at most a short kernel's time
        kernel_floor_ns = min(float(kr["dur_ns"].quantile(0.05) or 0.0), float(SHORT_KERNEL_NS))
        frame = frame.join(gk.rename({"fw": "index"}), on="index", how="left")
    else:
        if trace.has_gpu:
            missing.append("kernels carry no correlation to a host launch: each forward's GPU time is unknown")
        else:
            missing.append("no GPU work in the trace (a CPU run): no GPU time per forward")
        frame = frame.with_columns(pl.lit(None, pl.Int64).alias("gpu_ns"), pl.lit(None, pl.Int64).alias("gpu_end_ns"),
                                   pl.lit(None, pl.UInt32).alias("kernels"))
        kernel_floor_ns = None
    frame = frame.with_columns(pl.max_horizontal("end_host_ns", "gpu_end_ns").alias("end_ns"))
    # the host events the profiler recorded in each forward (its own cost scales with them)
    ev = host.lazy().filter(pl.col("tid") == tid).select("cat", "start_ns").collect()
    py = (ev["cat"] == "python_function").to_numpy()
    fw = forward_of(ev["start_ns"])
    frame = frame.with_columns(pl.Series("events", np.bincount(fw[(fw < n) & ~py], minlength=n + 1)[:n]),
                               pl.Series("py_events", np.bincount(fw[(fw < n) & py], minlength=n + 1)[:n]))
    # the host time inside each forward's outermost operators, and how many (what a CPU forward's work is)
    ops = host.lazy().filter((pl.col("tid") == tid) & (pl.col("cat") == "cpu_op")).select("start_ns", "dur_ns").collect()
    if not _rising(ops.get_column("start_ns")):  # (a reader's host table is in start order already: no copy)
        ops = ops.sort("start_ns")
    ops = ops.filter(pl.col("start_ns") >= (pl.col("start_ns") + pl.col("dur_ns")).cum_max().shift(1).fill_null(-1))
    ofw = forward_of(ops["start_ns"])
    keep = ofw < n
    frame = frame.with_columns(
        pl.Series("op_ms", np.bincount(ofw[keep], weights=ops["dur_ns"].fill_null(0).to_numpy()[keep], minlength=n)[:n] / 1e6),
        pl.Series("top_ops", np.bincount(ofw[keep], minlength=n)[:n]))
    if early_from == "named ranges":  # (the ranges decide on the tokens' final times)
        frame, phases_from = _phases(frame, host)
    else:  # (the shapes' phases do not move with them: those found above)
        phased = early.select("index", "recompute", "generation", "phase")
        frame, phases_from = frame.join(phased, on="index", how="left", maintain_order="left"), early_from
    # the profiler's costs are measured for a generation loop only (what they correct is its latency):
    # its one-off start-up cost, on the forward whose interval holds the first CUDA call
    generating = _generating(frame)
    startup = measure_startup(trace) if generating else None
    at = int(forward_of(pl.Series([startup.at_ns]))[0]) if startup is not None else n
    frame = frame.with_columns(pl.when(pl.col("index") == (frame["index"][at] if at < n else -1))
                               .then(startup.excess_ns / 1e6 if startup is not None else 0.0).otherwise(0.0).alias("startup_ms"))
    frame = frame.select(
        "index", "generation", "phase", "recompute", "batch", "q_len", "kv_len", "layers", "start_ns", "end_ns",
        ((pl.col("end_host_ns") - pl.col("start_ns")) / 1e6).alias("host_ms"), (pl.col("gpu_ns") / 1e6).alias("gpu_ms"),
        # the token's interval: from the token before (the generation's start for its first)
        ((pl.col("end_ns") - pl.col("end_ns").shift(1).over("generation").fill_null(pl.col("start_ns").first().over("generation")))
         / 1e6).alias("interval_ms"),
        "weight_bytes", "kv_bytes", "flops", "gemm_flops", "att_flops", (pl.col("shaped_ns") / 1e6).alias("shaped_ms"),
        "events", "py_events", "startup_ms", "op_ms", "top_ops", "kernels", "att_mask",
    )
    dev = trace.devices.head(1).to_dicts()[0] if trace.devices.height else {}
    peaks = datasheet_peaks(dev.get("name"), dev.get("sm_count")) if dev.get("name") else None
    if trace.has_gpu and peaks is None:
        missing.append(f"no datasheet peaks for the device ({dev.get('name') or 'unnamed'}): no MBU or MFU")
    elif not trace.has_gpu:
        missing.append("no GPU in the trace: MBU and MFU need a device's peaks (achieved rates are given)")
    central_at = 0.5  # a range given, or the model's: its middle
    if event_cost_us is None:
        cost = measure_event_cost(trace) if generating else None
        event_cost_us = (cost.lo_us, cost.hi_us) if cost is not None else EVENT_COST_US
        central_at = cost.central_at if cost is not None else 0.5
    lat = _latency(frame, event_cost_us, central_at)
    if startup is not None and "unprofiled_tpot_ms" in lat:  # what the unprofiled TTFT took off, said
        lat["profiler_startup"] = startup.to_dict()
    if frame.height and frame["phase"][0] == "decode":
        missing.append("the trace starts inside a generation (its first forward decodes over a context already there): "
                       "that generation's TTFT and end-to-end time are not in it")
    if compiled_forwards:
        missing.append(f"{compiled_forwards} forwards ran compiled (their operators are not in the trace): their "
                       "shapes, bytes and FLOPs are unknown; their time and GPU work are measured")
    return Inference(
        forwards=frame,
        latency=lat,
        utilisation=_utilisation(frame, lat, peaks, dtype),
        memory=_memory(frame),
        phases_from=phases_from,
        forwards_from=forwards_from,
        dtype=dtype,
        kernel_floor_ns=kernel_floor_ns,
        missing=tuple(missing),
        event_cost_us=event_cost_us,
    )


def _token_out(ends: np.ndarray, blocking: pl.DataFrame, tid: int, work: np.ndarray) -> np.ndarray:
    """Each forward's token out (ns, sorted): when the host has it, the end of the first call on
    the loop's thread that waits for the GPU after the forward ends (greedy or sampled decoding's
    ``.item()``, the EOS check, a streamer's copy) and before the next forward's work starts
    (``work``: the starts of the GEMMs and compiled regions on that thread); the forward's end
    where none comes between. A token is not out when its forward returns: its logits are still
    to be sampled and copied, and Hugging Face's ``generate()`` spends ~1 ms of a profiled token
    there (tests/data/inference/h100: TTFT from the generation's start to the prefill forward's
    end 12.84 ms, to the first token's check 14.2)."""
    s = blocking.filter(pl.col("tid") == tid).sort("sync_start_ns")
    if s.height == 0:
        return ends
    ss, se = s["sync_start_ns"].to_numpy(), s["sync_end_ns"].to_numpy()
    work = np.sort(work)
    i = np.searchsorted(ss, ends, side="left")
    j = np.clip(i, 0, ss.size - 1)
    nxt = np.searchsorted(work, ends, side="right")
    limit = np.where(nxt < work.size, work[np.clip(nxt, 0, work.size - 1)], np.iinfo(np.int64).max)
    limit = np.minimum(limit, np.append(ends[1:], np.iinfo(np.int64).max))
    out = np.where((i < ss.size) & (ss[j] < limit), np.maximum(se[j], ends), ends)
    return np.maximum.accumulate(out)


def _top_module(cpu: pl.DataFrame, tid: int, heads: np.ndarray) -> tuple[str, np.ndarray] | None:
    """The top module's forward ends (ns, sorted) and its class, where the trace records module
    ranges (``nn.Module: <Class>_<n>``, with_stack): the outermost module ranges on ``tid`` of the
    class whose calls each hold exactly one LM head and together hold them all (a generation
    loop's model, called once per token). None without such ranges."""
    # (five columns first: a trace with stacks holds a Python frame for every other event)
    m = cpu.lazy().select("cat", "name", "tid", "start_ns", "dur_ns").filter(
        (pl.col("tid") == tid) & (pl.col("cat") == "python_function") & pl.col("name").str.starts_with("nn.Module: ")).collect()
    if m.height == 0 or heads.size < 2:
        return None
    end = pl.col("start_ns") + pl.col("dur_ns")
    m = m.sort("start_ns").filter(pl.col("start_ns") >= end.cum_max().shift(1).fill_null(-1))
    # "nn.Module: LlamaForCausalLM_0": the class, without the instance number
    m = m.with_columns(pl.col("name").str.slice(len("nn.Module: ")).str.replace(r"_[0-9]+$", "").alias("cls"), end.alias("end_ns"))
    heads = np.sort(heads)
    for (cls,), calls in m.group_by("cls"):
        s, e = calls["start_ns"].to_numpy(), calls["end_ns"].to_numpy()
        if s.size != heads.size:
            continue
        i = np.searchsorted(s, heads, side="right") - 1
        if (i >= 0).all() and (heads <= e[np.clip(i, 0, None)]).all() and np.array_equal(np.unique(i), np.arange(s.size)):
            return str(cls), np.sort(e)
    return None


def token_steps(inf: Inference) -> pl.DataFrame:
    """A generation loop's forwards as profiler steps (``model.STEP_SCHEMA``: ``step``, ``start_ns``,
    ``end_ns``, ns): a token a step, from its forward's start to its token."""
    f = inf.forwards
    return pl.DataFrame({"step": f["index"].cast(pl.Int64), "start_ns": f["start_ns"].cast(pl.Int64),
                         "end_ns": f["end_ns"].cast(pl.Int64)})


def _with_compiled(source: Trace | pl.DataFrame, tid: int, heads: np.ndarray) -> tuple[np.ndarray, int]:
    """The forward ends: the LM heads' and, where the decode runs compiled (a static cache with
    torch.compile: Hugging Face compiles the decode forward, whose CUDA graph replays show no
    operators), each outermost compiled region's end, one region a forward. Regions stand for
    forwards only where no eager LM head runs between two of them: a graph break splits one
    forward into several regions, and its LM head then still ends each forward. Returns the ends
    (sorted, ns) and how many are compiled forwards."""
    spans = source if isinstance(source, pl.DataFrame) else region_spans(source)[0]
    r = spans.filter((pl.col("tid") == tid) & pl.col("name").str.starts_with("Torch-Compiled Region")).sort("start_ns")
    if r.height == 0:
        return np.sort(heads), 0
    r = r.filter(pl.col("start_ns") >= pl.col("end_ns").cum_max().shift(1).fill_null(-1))
    rs, re = r["start_ns"].to_numpy(), r["end_ns"].to_numpy()
    i = np.searchsorted(rs, heads, side="right") - 1
    inside = (i >= 0) & (heads < re[np.clip(i, 0, None)])
    between = (~inside) & (heads > rs[0]) & (heads < re[-1])
    if between.any():
        return np.sort(heads), 0
    return np.sort(np.concatenate([heads[~inside], re])), len(re)


def _phases(f: pl.DataFrame, cpu: pl.DataFrame) -> tuple[pl.DataFrame, str]:
    """Each forward's phase and generation (see the module doc). ``cpu``: the host table."""
    q, kv = f["q_len"], f["kv_len"]
    prev_q, prev_kv = q.shift(1), kv.shift(1)
    # (without attention shapes kv is unknown: the query growing by one token a forward says it)
    recompute = (q > 1) & ((q == kv) | kv.is_null()) & prev_q.is_not_null() & (q == prev_q + 1)
    # a new sequence: the first forward, or a forward whose context does not follow the last
    starts = (pl.Series(np.arange(f.height)) == 0) | ((q > 1) & ~recompute.fill_null(False)) | (kv < prev_kv).fill_null(False)
    if q.null_count() == f.height:
        starts = pl.Series(np.arange(f.height) == 0)
        recompute = pl.Series([False] * f.height)
    starts = starts.fill_null(False)  # a forward without shapes (compiled) continues its generation
    f = f.with_columns(pl.Series("recompute", recompute.fill_null(False)), pl.Series("generation", starts.cast(pl.Int64).cum_sum() - 1))
    # a trace that starts mid-generation (a serving engine profiled while it serves): its first
    # forward decodes one token over a context already there
    mid = pl.Series(np.arange(f.height) == 0) & (q == 1).fill_null(False) & (kv > 1).fill_null(False)
    phase = pl.when(pl.Series(starts) & ~mid).then(pl.lit("prefill")).otherwise(pl.lit("decode"))
    f = f.with_columns(phase.alias("phase"))
    frm = "shapes" if q.null_count() < f.height else "order (first forward is the prefill)"
    # named phase ranges override: a forward whose LM head ends inside one takes its phase
    ranges = cpu.lazy().filter(pl.col("cat") == "user_annotation").select("name", "start_ns", "dur_ns").collect()
    for name, pattern in PHASE_RANGES.items():
        r = ranges.filter(pl.col("name").str.contains(pattern))
        if r.height == 0:
            continue
        s, e = r["start_ns"].to_numpy(), (r["start_ns"] + r["dur_ns"]).to_numpy()
        order = np.argsort(s)
        s, e = s[order], np.maximum.accumulate(e[order])
        t = f["end_ns"].to_numpy()
        i = np.searchsorted(s, t, side="right") - 1
        inside = (i >= 0) & (t <= e[np.clip(i, 0, None)])
        f = f.with_columns(pl.when(pl.Series(inside)).then(pl.lit(name)).otherwise(pl.col("phase")).alias("phase"))
        frm = "named ranges"
    return f, frm


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), nd)


def _latency(f: pl.DataFrame, event_cost_us: tuple[float, float], central_at: float = 0.5) -> dict[str, Any]:
    """TTFT, TPOT, ITL, end-to-end and tokens/s per generation, their medians over generations."""
    gens = []
    for gen in f.partition_by("generation", maintain_order=True):  # a loop over generations, not events
        t = gen["end_ns"].to_numpy()
        tokens = gen.height
        batch = int(gen["batch"][0]) if gen["batch"][0] is not None else None
        e2e_ns = t[-1] - gen["start_ns"][0]
        itl = np.diff(t) / 1e6
        if gen["phase"][0] == "decode":  # began before the trace: no TTFT, no end-to-end; tokens/s over its tokens
            gens.append({"ttft_ms": None, "tpot_ms": float(itl.mean()) if itl.size else None,
                         "itl_median_ms": float(np.median(itl)) if itl.size else None,
                         "itl_p90_ms": float(np.percentile(itl, 90)) if itl.size else None, "e2e_ms": None,
                         "tokens_per_sequence": None, "batch": batch,
                         "output_tokens_per_s": (batch or 1) * itl.size / (itl.sum() / 1e3) if itl.size and itl.sum() > 0 else None})
            continue
        gens.append({
            "ttft_ms": (t[0] - gen["start_ns"][0]) / 1e6,
            "tpot_ms": (t[-1] - t[0]) / (tokens - 1) / 1e6 if tokens > 1 else None,
            "itl_median_ms": float(np.median(itl)) if itl.size else None,
            "itl_p90_ms": float(np.percentile(itl, 90)) if itl.size else None,
            "e2e_ms": e2e_ns / 1e6,
            "tokens_per_sequence": tokens,
            "batch": batch,
            "output_tokens_per_s": (batch or 1) * tokens / (e2e_ns / 1e9) if e2e_ns > 0 else None,
        })

    def med(k: str) -> float | None:
        v = [g[k] for g in gens if g[k] is not None]
        return _r(float(np.median(v))) if v else None

    return {
        **_unprofiled(f, event_cost_us, central_at),
        "convention": "TPOT as NVIDIA GenAI-Perf counts it: (last token - first token) / (tokens - 1), the mean of "
        "vLLM's inter-token latencies (ITL: each gap between tokens); TTFT from the generation's first operator",
        "timing": "profiled",
        "timing_note": "measured on the profiled run's clock: the profiler's own cost is in these times",
        "generations": len(gens),
        "ttft_ms": med("ttft_ms"),
        "tpot_ms": med("tpot_ms"),
        "itl_median_ms": med("itl_median_ms"),
        "itl_p90_ms": med("itl_p90_ms"),
        "e2e_ms": med("e2e_ms"),
        "tokens_per_sequence": med("tokens_per_sequence"),
        "batch": gens[0]["batch"] if gens else None,
        "output_tokens_per_s": med("output_tokens_per_s"),
    }


def _less_profiler(col: str, at: float, event_cost_us: tuple[float, float]) -> pl.Expr:
    """``col`` (ms) less the profiler's cost of each forward's recorded events at ``at`` of the
    per-event cost's range (``event_cost_us``; 0: cheapest, 1: dearest, ``cost_at``) and its
    start-up cost (``startup_ms``), not below a dispatch per operator."""
    cost = (pl.col("events") * cost_at(event_cost_us, at) + pl.col("py_events") * cost_at(PYTHON_COST_US, at)) / 1e3
    return pl.max_horizontal(pl.col(col) - cost - pl.col("startup_ms"), pl.col("events") * FLOOR_OP_US / 1e3)


# a decode forward whose outermost operators took this much longer than the median forward's with
# as many events ran on a slowed host (``_host_slowed``)
HOST_SLOWED = 1.3


def _host_slowed(d: pl.DataFrame) -> pl.Series:
    """The decode forwards that ran on a slowed host: as many recorded events as the usual
    forward, and their outermost operators' host time (``op_ms``: the dispatch and the
    profiler's callbacks, no Python between them) ``HOST_SLOWED`` times the median forward's or
    more. Each operator taking longer alike is the host's speed, not the program's work: on the
    H100 generate() sets' profiled runs, up to 6 of 31 tokens ran 1.3-2.4x the median token with
    the same events (a first recording: 3 and 6 at batch 1, without and with a cache, where the
    same cases' bare runs met 0 and 5 of 155). The unprofiled TPOT counts such a token at the
    typical one's time (the bare program meets fewer of them: its estimate leaves those few out)
    and says how many it did."""
    if d.height < 5 or d["op_ms"].null_count() == d.height:
        return pl.Series([False] * d.height)
    usual = d["events"].mode().sort()[0]
    same = d.filter(pl.col("events") == usual)
    ref = same["op_ms"].median()
    if not ref or ref <= 0:  # (no operator time to compare: nothing to say)
        return pl.Series([False] * d.height)
    return ((d["events"] == usual) & (d["op_ms"] >= HOST_SLOWED * ref)).fill_null(False)


def _unprofiled(f: pl.DataFrame, event_cost_us: tuple[float, float], central_at: float = 0.5) -> dict[str, Any]:
    """The tokens' times without the profiler (estimated, ms): the profiler's per-event cost
    (``event_cost_us``, ``observer.PYTHON_COST_US``) taken off each forward's interval, never
    below its GPU time nor an unprofiled eager operator's dispatch (``FLOOR_OP_US``). At
    ``central_at`` of the cost's range (``cost_at``; 1, its high end, for a cost measured from the
    trace: the gaps' mean, what the events cost together, ``event_cost.measure``; the middle of
    the model's range): TPOT (the decode forwards' mean, a forward on a slowed host,
    ``_host_slowed``, counted at the others' median), TTFT (the prefill
    forwards' sum, per generation) and output tokens/s from them; at its high and low ends, the
    range of the median inter-token latency and of TTFT."""
    d = f.filter(pl.col("phase") == "decode")
    p = f.filter(pl.col("phase") == "prefill")
    if d.height == 0:
        return {}

    def less(at: float) -> pl.Expr:
        return pl.max_horizontal(_less_profiler("interval_ms", at, event_cost_us), pl.col("gpu_ms").fill_null(0))

    def median(rows: pl.DataFrame, at: float) -> float:
        return float(rows.select(less(at).median()).item())

    def span(rows: pl.DataFrame) -> list:
        return [_r(median(rows, 1)), _r(median(rows, 0))]

    gens = max(int(f["generation"].n_unique()), 1)
    slowed = _host_slowed(d)
    typical = d.filter(~slowed).select(less(central_at).median()).item() if slowed.any() else None
    if typical is None:
        slowed = pl.Series([False] * d.height)
    tpot = float(d.select(pl.when(slowed).then(typical).otherwise(less(central_at)).mean()).item())
    ttft = float(p.select(less(central_at).sum()).item()) / gens if p.height else None
    central = {"unprofiled_tpot_ms": _r(tpot), **(_end_to_end(f, ttft, tpot) if ttft is not None else {})}
    basis = ""
    if slowed.any():
        central["host_slowed_tokens"] = int(slowed.sum())
        basis = (f"; {int(slowed.sum())} decode tokens ran on a slowed host (the usual events, each operator "
                 f"{HOST_SLOWED:g}x the usual token's time or more) and are counted at the others' median")
    return {**central, "unprofiled_itl_median_ms_range": span(d),
            **({"unprofiled_ttft_ms_range": span(p)} if p.height else {}),
            "unprofiled_basis": f"estimated: the profiler's per-event cost ({event_cost_us[0]:.2f}-{event_cost_us[1]:.2f} us; "
            f"the estimate at {cost_at(event_cost_us, central_at):.2f} us"
            + (", the gaps' mean: what the events cost together" if central_at == 1.0 else "") + ") "
            "and its start-up cost on the first CUDA call (measured against that operator's later calls) "
            "taken off each forward's interval, not below its GPU time or 1 us of dispatch per operator (TTFT: the "
            "prefill forwards')" + basis,
            "events_per_decode_forward": _r(float(d["events"].median()), 1)}


def _end_to_end(f: pl.DataFrame, ttft: float, tpot: float) -> dict[str, Any]:
    """The unprofiled TTFT, end-to-end time and output tokens/s of a generation of ``f``'s forwards
    from its unprofiled TTFT and TPOT (ms)."""
    gens = max(int(f["generation"].n_unique()), 1)
    tokens = 1 + f.filter(pl.col("phase") == "decode").height / gens  # the prefill's token and each decode forward's
    batch = f["batch"].drop_nulls().median()
    e2e = ttft + (tokens - 1) * tpot
    return {"unprofiled_ttft_ms": _r(ttft), "unprofiled_e2e_ms": _r(e2e),
            "unprofiled_output_tokens_per_s": _r(batch * tokens / e2e * 1e3) if batch else None}


def replayed_latency(inf: Inference, token_ms: dict[int, float], cost_us: float) -> dict[str, Any]:
    """The unprofiled TTFT, TPOT, end-to-end time and tokens/s from each token's time in the
    what-if replay of the bare plan (``token_ms``: forward index -> ms, its start to the next
    forward's, ``whatif.model.WhatIf.bare_step_times``; ``cost_us``: the per-event cost it took
    off), where the forwards are the trace's steps. The replay keeps what the subtraction of
    ``_unprofiled`` cannot: a token's kernels against its host work, launch by launch, and the
    syncs between them. A host twice as fast leaves the GPU's share of a token on its critical
    path (TinyLlama without a cache at batch 8: the subtraction 12.47 ms a token, the replay
    12.84, bare 14.03). The decode tokens are those with a next forward in their generation (the
    last one's time runs into the next generation), a token ``_host_slowed`` counted at the
    others' median as there; TTFT is each generation's prefill forwards' times. Empty where the
    replay holds no decode token."""
    f = inf.forwards.with_columns(pl.col("index").replace_strict(token_ms, default=None, return_dtype=pl.Float64).alias("replayed"),
                                  (pl.col("generation").shift(-1) == pl.col("generation")).fill_null(False).alias("next"))
    d = f.filter((pl.col("phase") == "decode") & pl.col("next") & pl.col("replayed").is_not_null())
    if d.height == 0:
        return {}
    slowed = _host_slowed(d)
    t = d["replayed"]
    if slowed.any() and (~slowed).any():
        t = pl.select(pl.when(slowed).then(t.filter(~slowed).median()).otherwise(t)).to_series()
    tpot = float(t.mean())
    p = f.filter(pl.col("phase") == "prefill")
    gens = max(int(f["generation"].n_unique()), 1)
    out: dict[str, Any] = {"unprofiled_tpot_ms": _r(tpot)}
    if p.height and p["replayed"].null_count() == 0:
        # (the profiler's start-up, host time in the replay, off the forward that paid it)
        ttft = float(p.select(pl.max_horizontal(pl.col("replayed") - pl.col("startup_ms"), pl.col("gpu_ms").fill_null(0)).sum()).item())
        out.update(_end_to_end(f, ttft / gens, tpot))
    lat = inf.latency  # (the subtraction's ranges, widened to hold the replayed figures)
    lo, hi = lat.get("unprofiled_itl_median_ms_range") or (tpot, tpot)
    out["unprofiled_itl_median_ms_range"] = [_r(min(lo, float(t.median()))), _r(max(hi, float(t.median())))]
    if "unprofiled_ttft_ms" in out and lat.get("unprofiled_ttft_ms_range"):
        lo, hi = lat["unprofiled_ttft_ms_range"]
        out["unprofiled_ttft_ms_range"] = [_r(min(lo, out["unprofiled_ttft_ms"])), _r(max(hi, out["unprofiled_ttft_ms"]))]
    out["unprofiled_basis"] = (f"replayed: each token's host events less the profiler's cost ({cost_us:.2f} us an event) "
                               "against its kernels, launch by launch, with its syncs (the what-if model's bare plan), "
                               "and the start-up cost on the first CUDA call off the first token; the range: "
                               + lat.get("unprofiled_basis", "").removeprefix("estimated: "))
    return out


def _utilisation(f: pl.DataFrame, lat: dict, peaks, dtype: str | None) -> dict[str, Any]:
    dec = f.filter((pl.col("phase") == "decode") & ~pl.col("recompute"))
    pre = f.filter(pl.col("phase") == "prefill")
    out: dict[str, Any] = {"provenance": "derived: bytes and FLOPs from the recorded input shapes, times measured",
                           "hbm_peak_gbps": peaks.hbm_gbps if peaks else None}
    if dec.height and lat.get("tpot_ms"):
        w = dec["weight_bytes"].median()
        basis = "weight + KV bytes read per forward over the time per output token (TPOT)"
        if w is None and f["weight_bytes"].is_not_null().any():
            # compiled decode forwards show no operators: they read the weights the eager forwards read
            w = f["weight_bytes"].max()
            basis += "; weights from the eager forwards (the compiled decode's operators are not in the trace)"
        kvb = dec["kv_bytes"].median() if dec["kv_bytes"].is_not_null().any() else None
        if kvb is None:
            basis += "; KV bytes unknown (no attention shapes in decode): weights only, a lower bound"
        per_token = (w or 0) + (kvb or 0)
        gbps = per_token / (lat["tpot_ms"] / 1e3) / 1e9
        out["decode"] = {
            "weight_bytes_per_forward": int(w) if w is not None else None,
            "kv_bytes_per_forward": int(kvb) if kvb is not None else None,
            "achieved_gbps": _r(gbps),
            "hbm_peak_gbps": peaks.hbm_gbps if peaks else None,
            "mbu_pct": _r(100 * gbps / peaks.hbm_gbps, 1) if peaks else None,
            "basis": basis,
        }
        gpu = dec["gpu_ms"].median() if dec["gpu_ms"].is_not_null().any() else None
        if gpu:
            out["decode"]["gpu_ms_per_forward"] = _r(gpu)
            out["decode"]["gpu_busy_pct"] = _r(100 * gpu / lat["tpot_ms"], 1)
    if pre.height:
        row = pre.row(0, named=True)
        t_ms = row["gpu_ms"] or row["host_ms"]
        tflops = row["flops"] / (t_ms / 1e3) / 1e12 if t_ms and row["flops"] else None
        peak = peaks.matrix_tflops(_PEAK_DTYPE.get(dtype or "")) if peaks and dtype in _PEAK_DTYPE else None
        out["prefill"] = {
            "flops": row["flops"],
            "time_ms": _r(t_ms),
            "time_basis": "GPU kernel time" if row["gpu_ms"] else "host time",
            "achieved_tflops": _r(tflops),
            "peak_tflops": peak,
            "mfu_pct": _r(100 * tflops / peak, 1) if tflops and peak else None,
        }
    return out


def _memory(f: pl.DataFrame) -> dict[str, Any]:
    kept = f.filter(~pl.col("recompute") & (pl.col("phase") == "decode") & pl.col("kv_bytes").is_not_null())
    if kept.height == 0:
        why = ("no KV cache: every decode forward recomputed its context" if f["recompute"].any()
               else "no decode forward with attention shapes")
        return {"kv_cache_bytes": None, "why": why}
    last, first = kept.row(-1, named=True), kept.row(0, named=True)
    grow = (last["kv_bytes"] - first["kv_bytes"]) / (last["kv_len"] - first["kv_len"]) if last["kv_len"] != first["kv_len"] else 0.0
    return {
        "kv_cache_bytes": int(last["kv_bytes"]),
        "kv_len": int(last["kv_len"]),
        "growth_bytes_per_token": _r(grow, 1),
        "static": last["kv_len"] == first["kv_len"] and kept.height > 1,
        "provenance": "derived: key and value shapes of every layer's attention at the last decode forward",
    }


def recompute_cost(inf: Inference) -> dict[str, Any] | None:
    """What recomputing the context costs, per decode forward that recomputed it (``recompute``),
    from its own shapes and times (derived): a cached forward computes one position instead of
    ``q_len``, so its GEMMs' FLOPs are ``1/q_len`` of these and its attention's one query row. The
    time that scales with that work: on a GPU the forward's kernel time (``gpu_ms``), scaled by the
    FLOP ratio but never below reading the weights once at the device's HBM peak (where known) nor
    its kernels' count times the least a kernel takes in the trace (``kernel_floor_ns``), the
    rest of the interval (launches, the host) staying; on a CPU the time inside the forward's
    outermost operators (``op_ms``, below), the rest staying. Returns the forwards, the contexts, the
    measured and predicted cached intervals and the saving (ms), or None without a recomputing
    forward.

    On a CPU every outermost operator of the forward works over the context (the GEMMs, the
    attention, the norms and activations over ``[batch, q, hidden]``), so its time shrinks by the
    FLOP ratio down to what a profiled operator costs at least: its dispatch (``FLOOR_OP_US``) and
    the profiler's recording (the per-event cost's low end); the time outside operators stays. On
    tests/data/inference this predicts what the cached trace's decode saves 11% low at batch 1 and
    8% low at batch 4 (scaling the GEMM and attention time alone: 16% and 24% low)."""
    f = inf.forwards.filter(pl.col("recompute") & pl.col("q_len").is_not_null()) if inf.found else None
    if f is None or f.height == 0:
        return None
    cached_flops = pl.col("gemm_flops") / pl.col("q_len") + pl.col("att_flops").fill_null(0) / pl.col("q_len")
    ratio = (cached_flops / pl.col("flops")).clip(0.0, 1.0)
    gpu = f["gpu_ms"].is_not_null().any()
    peak = inf.utilisation.get("hbm_peak_gbps")
    if gpu:
        # not below reading the weights once, nor below each kernel's least time (kernels at one
        # token are latency-bound: a recompute of short kernels saves nothing)
        floor = pl.max_horizontal((pl.col("weight_bytes") / (peak * 1e9) * 1e3) if peak else pl.lit(0.0),
                                  pl.col("kernels").fill_null(0) * (inf.kernel_floor_ns or 0.0) / 1e6)
        scaled = pl.col("gpu_ms").fill_null(0)
        return _recompute_on_gpu(f, ratio, pl.max_horizontal(scaled * ratio, floor), inf.event_cost_us)
    else:
        scaled = pl.col("op_ms").clip(upper_bound=pl.col("interval_ms"))
        floor = pl.col("top_ops") * (FLOOR_OP_US + inf.event_cost_us[0]) / 1e3
        cached = pl.col("interval_ms") - scaled + pl.min_horizontal(pl.max_horizontal(scaled * ratio, floor), scaled)
    c = f.select(pl.col("interval_ms").sum().alias("measured"), cached.sum().alias("cached"), ratio.median().alias("ratio"),
                 scaled.sum().alias("scaled"))
    measured_ms, cached_ms = float(c["measured"][0]), float(c["cached"][0])
    return {"forwards": f.height, "context_min": int(f["q_len"].min()), "context_max": int(f["q_len"].max()),
            "measured_ms": _r(measured_ms), "cached_ms": _r(cached_ms), "gain_ms": _r(max(measured_ms - cached_ms, 0.0)),
            "work_scaled_ms": _r(float(c["scaled"][0])), "flop_ratio_median": _r(float(c["ratio"][0]), 5),
            "time_basis": "GPU kernel time" if gpu else "host time in the forward's outermost operators"}


def _recompute_on_gpu(f: pl.DataFrame, ratio: pl.Expr, gpu_cached: pl.Expr, event_cost_us: tuple[float, float]) -> dict[str, Any]:
    """A GPU's recomputing forwards, cached: the host launches while the GPU runs, so a forward
    takes the longer of its host time and its GPU time, and less GPU work gives back only what the
    GPU held the token up by. The unprofiled host time is the profiled one less the profiler's
    per-event cost (its range, ``event_cost``, never below a dispatch per operator), so the saving
    is a range: its low end at the cheapest profiler (the host slowest, hiding the most GPU work),
    its high end at the dearest. A host that outlasts the GPU at both ends hides the recomputation:
    a cache then saves nothing, whatever the FLOP ratio (and its own host work, which the trace of
    a loop without one cannot show, can make the token slower)."""

    def host_at(end: int) -> pl.Expr:
        return _less_profiler("host_ms", float(end), event_cost_us)

    gpu_now = pl.col("gpu_ms").fill_null(0)

    def saving(end: int) -> pl.Expr:
        host = host_at(end)
        return (pl.max_horizontal(host, gpu_now) - pl.max_horizontal(host, gpu_cached)).clip(0.0)

    c = f.select(pl.col("interval_ms").sum().alias("measured"), saving(0).sum().alias("low"), saving(1).sum().alias("high"),
                 ratio.median().alias("ratio"), gpu_now.sum().alias("scaled"), host_at(0).sum().alias("host_hi"),
                 host_at(1).sum().alias("host_lo"))
    measured_ms, low, high = (float(c[k][0]) for k in ("measured", "low", "high"))
    return {"forwards": f.height, "context_min": int(f["q_len"].min()), "context_max": int(f["q_len"].max()),
            "measured_ms": _r(measured_ms), "cached_ms": _r(measured_ms - low), "gain_ms": _r(low),
            "gain_range_ms": [_r(low), _r(high)], "work_scaled_ms": _r(float(c["scaled"][0])),
            "unprofiled_host_ms_range": [_r(float(c["host_lo"][0])), _r(float(c["host_hi"][0]))],
            "flop_ratio_median": _r(float(c["ratio"][0]), 5),
            "time_basis": "GPU kernel time against the unprofiled host time: each forward takes the longer of the two"}

