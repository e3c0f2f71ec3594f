"""LLM inference (issue 57): Hugging Face ``generate()`` of a tiny Llama recorded on a CPU under
torch.profiler with its bare timings (tests/data/inference, made by
tests/data/record/record_inference.py): use_cache True and False, batch 1 and 4."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import numpy as np
import pytest

import proflab
from proflab.analysis.context import Context
from proflab.analysis.timeline.inference import recompute_cost

DATA = Path(__file__).parent / "data" / "inference"
TRUTH = json.loads((DATA / "truth.json").read_text())
CASES = {c["case"]: c for c in TRUTH["cases"]}
CFG = TRUTH["config"]
EAGER = sorted(c for c in CASES if not c.startswith("static"))  # every forward's operators in the trace


@pytest.fixture(scope="module")
def traces():
    return {name: proflab.load(DATA / f"{name}.pt.trace.json.gz") for name in CASES}


@pytest.fixture(scope="module")
def views(traces):
    return {name: Context(t).inference for name, t in traces.items()}


@pytest.mark.parametrize("name", EAGER)
def test_forwards_and_phases_from_the_shapes(views, name):
    inf, case = views[name], CASES[name]
    f = inf.forwards
    assert inf.phases_from == "shapes"
    # one forward per new token: the prompt's (prefill), then one per token after it
    assert f.height == case["new_tokens"] and f["generation"].n_unique() == 1
    assert f["phase"].to_list() == ["prefill"] + ["decode"] * (case["new_tokens"] - 1)
    assert (f["batch"] == case["batch"]).all() and (f["layers"] == CFG["num_hidden_layers"]).all()
    assert f["q_len"][0] == f["kv_len"][0] == case["prompt_tokens"]
    # the context grows by one each forward; cached decodes run one query position over it
    assert f["kv_len"].to_list() == list(range(case["prompt_tokens"], case["prompt_tokens"] + case["new_tokens"]))
    cached = name.startswith("cache")
    assert (f["q_len"][1:] == 1).all() if cached else (f["q_len"][1:] == f["kv_len"][1:]).all()
    assert int(f["recompute"].sum()) == (0 if cached else case["new_tokens"] - 1)


def _weights_bytes() -> int:
    """The GEMMs' weights (every layer's projections and the LM head; not the embedding, a gather)
    in float32."""
    h, i, layers, heads, kvh, vocab = (CFG[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                         "num_attention_heads", "num_key_value_heads", "vocab_size"))
    kv = h // heads * kvh
    return 4 * (layers * (2 * h * h + 2 * h * kv + 3 * h * i) + vocab * h)


def test_bytes_per_token_and_the_kv_cache_follow_from_the_config(views):
    h, layers, heads, kvh = (CFG[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"))
    per_position = 2 * layers * kvh * (h // heads) * 4  # key and value of every layer, float32, one sequence
    for name in EAGER:
        inf, case = views[name], CASES[name]
        assert (inf.forwards["weight_bytes"] == _weights_bytes()).all()
        last = inf.forwards["kv_len"][-1]
        assert inf.forwards["kv_bytes"][-1] == case["batch"] * per_position * last
        mem = inf.memory
        if name.startswith("cache"):
            assert mem["kv_cache_bytes"] == case["batch"] * per_position * last
            assert mem["growth_bytes_per_token"] == case["batch"] * per_position and not mem["static"]
            dec = inf.utilisation["decode"]
            assert dec["weight_bytes_per_forward"] == _weights_bytes() and dec["mbu_pct"] is None  # no device: no peak
        else:
            assert mem["kv_cache_bytes"] is None and "recomputed" in mem["why"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_latency_is_consistent_and_its_unprofiled_estimate_below_it(views, name):
    lat, f = views[name].latency, views[name].forwards
    t = f["end_ns"].to_numpy()
    assert lat["ttft_ms"] == pytest.approx((t[0] - f["start_ns"][0]) / 1e6, abs=1e-3)
    assert lat["tpot_ms"] == pytest.approx((t[-1] - t[0]) / (len(t) - 1) / 1e6, abs=1e-3)
    assert lat["output_tokens_per_s"] == pytest.approx(CASES[name]["batch"] * len(t) / (lat["e2e_ms"] / 1e3), rel=1e-3)
    assert lat["timing"] == "profiled" and "TPOT" in lat["convention"] and "ITL" in lat["convention"]
    lo, hi = lat["unprofiled_itl_median_ms_range"]
    assert 0 < lo <= hi <= lat["itl_median_ms"]


def test_the_profiled_tokens_are_slower_than_the_bare_ones(views):
    """On a CPU the profiler costs a tiny model's operators about half their time again (the
    bare runs' median inter-token gap against the trace's: 0.62 -> 0.94 ms at batch 1 with a
    cache); the trace is never faster than the program it recorded, and not by more than 2.5x."""
    import statistics

    for name, inf in views.items():
        bare = statistics.median(x for r in CASES[name]["bare_runs"] for x in r["itl_ms"])
        assert bare < inf.latency["itl_median_ms"] < 2.5 * bare


def _report(traces, name):
    return proflab.analyze(traces[name])


@pytest.mark.parametrize("batch", [1, 4])
def test_recomputed_context_is_found_without_a_cache_and_not_with_one(traces, batch):
    nocache, cache = _report(traces, f"nocache-b{batch}"), _report(traces, f"cache-b{batch}")
    (f,) = [f for f in nocache.findings if f.category == "kv_cache_recompute"]
    assert f.where["phase"] == ["decode"] and f.prediction["model"] == "work ratio"
    assert not [f for f in cache.findings if f.category == "kv_cache_recompute"]
    # the fix, measured: the cached trace's decode tokens against these (medians: a preempted
    # token moves neither), both profiled alike: 22.7 ms predicted of 25.4 at batch 1, 148.9 of
    # 161.2 at batch 4
    def decode(name):
        f = Context(traces[name]).inference.forwards
        return f.filter(pl.col("phase") == "decode")["interval_ms"]

    d_no, d_yes = decode(f"nocache-b{batch}"), decode(f"cache-b{batch}")
    measured_ms = (d_no.median() - d_yes.median()) * d_no.len()
    assert 0.85 * measured_ms <= f.est_gain_ms <= 1.15 * measured_ms


def test_recompute_is_not_claimed_where_it_costs_nothing(views):
    inf = views["nocache-b4"]
    # the same forwards with the work that scales with the context taking no time: nothing to save
    free = inf.__class__(inf.forwards.with_columns(pl.lit(0.0).alias("op_ms")), inf.latency, inf.utilisation, inf.memory,
                         inf.phases_from, inf.dtype, inf.missing)
    assert recompute_cost(free)["gain_ms"] == 0
    assert recompute_cost(views["cache-b4"]) is None


def test_named_phase_ranges_override_the_shapes(traces):
    t = traces["cache-b1"]
    inf = Context(t).inference
    f = inf.forwards
    # a decode range around the first forward's token (as an engine that names its steps would)
    row = {c: None for c in t.cpu.columns} | {"cat": "user_annotation", "name": "decode_step", "pid": 0, "tid": 0,
                                              "start_ns": int(f["start_ns"][0]), "dur_ns": int(f["end_ns"][0] - f["start_ns"][0] + 1)}
    cpu = pl.concat([t.cpu, pl.DataFrame([row], schema=t.cpu.schema)])
    named = Context(type(t)(t.gpu, cpu, t.steps, t.devices, t.meta, t.comms)).inference
    assert named.phases_from == "named ranges" and named.forwards["phase"][0] == "decode"


def test_without_shapes_the_forwards_are_said_missing(traces):
    t = traces["cache-b1"]
    bare = type(t)(t.gpu, t.cpu.with_columns(pl.lit(None, pl.Categorical).alias("input_dims")), t.steps, t.devices, t.meta, t.comms)
    inf = Context(bare).inference
    assert not inf.found and "record_shapes=True" in inf.missing[0]
    assert "inference" not in proflab.analyze(bare).summary


def test_the_report_carries_it_valid_and_rendered(traces):
    import jsonschema

    from proflab.render.markdown import render_markdown
    from proflab.render.terminal import render_terminal

    rep = _report(traces, "nocache-b4")
    d = rep.to_dict()
    schema = json.loads((Path(proflab.__file__).parent / "schema" / "report.schema.json").read_text())
    jsonschema.validate(d, schema)
    inf = d["summary"]["inference"]
    assert inf["phases"] == {"prefill": 1, "decode": 19} and inf["recomputed_forwards"] == 19
    assert any(m["signal"] == "pad tokens" for m in d["missing"])
    assert "Inference: 20 forwards" in render_terminal(rep, width=200)
    assert "## Inference" in render_markdown(rep)


def test_without_attention_shapes_the_gemms_tell_the_phases(traces):
    """A serving engine's attention is its own operator (vLLM's, FlashAttention's varlen): the
    GEMMs' rows computed per row produced give the query length instead."""
    for name in ("cache-b4", "nocache-b4"):
        t = traces[name]
        cpu = t.cpu.with_columns(pl.when(pl.col("name").str.contains("scaled_dot_product")).then(None)
                                 .otherwise(pl.col("input_dims")).cast(pl.Categorical).alias("input_dims"))
        inf = Context(type(t)(t.gpu, cpu, t.steps, t.devices, t.meta, t.comms)).inference
        f = inf.forwards
        assert f["phase"].to_list() == ["prefill"] + ["decode"] * 19 and (f["batch"] == 4).all()
        assert int(f["recompute"].sum()) == (0 if name == "cache-b4" else 19)
        assert any("no attention operator" in m for m in inf.missing)


def test_a_vllm_profiler_directory_is_read_as_it_is(tmp_path, traces):
    """VLLM_TORCH_PROFILER_DIR holds a gzipped trace per worker and the profiler's text table."""
    import shutil

    shutil.copy(DATA / "cache-b1.pt.trace.json.gz", tmp_path / "dp0_pp0_tp0_dcp0_ep0_rank0.1765000000000.pt.trace.json.gz")
    (tmp_path / "profiler_out_0.txt").write_text("Name  Self CPU %  Self CPU  CPU total %\n")
    from proflab.cli import main

    out = tmp_path / "report.json"
    assert main(["analyze", str(tmp_path), "-o", str(out)]) == 0
    assert json.loads(out.read_text())["summary"]["inference"]["forwards"] == 20


def test_a_training_loop_is_not_a_generation_loop():
    """A GPT trained step by step runs full-length forwards (each its own prefill), with autocast's
    nested aten::linear: no inference section, no inference finding."""
    t = proflab.load(Path(__file__).parent / "data" / "kineto" / "train_loop.pt.trace.json.gz")
    inf = Context(t).inference
    assert inf.forwards.height == 3 and (inf.forwards["phase"] == "prefill").all() and not inf.found


def _on_a_gpu(t, kernel_us: float, sync: bool):
    """The CPU trace as if it ran on an H100: each GEMM launches one kernel of ``kernel_us`` 1 us
    after it starts (runtime call and kernel linked by correlation), and with ``sync`` the host
    waits on the stream once after each LM head (sampling's ``.item()``)."""
    ops = t.cpu.filter((pl.col("name") == "aten::mm") | (pl.col("name") == "aten::_scaled_dot_product_flash_attention_for_cpu"))
    n = ops.height
    corr = pl.Series(range(1, n + 1), dtype=pl.Int64)
    launch_at = ops["start_ns"] + 1_000
    runtime = pl.DataFrame({"cat": ["cuda_runtime"] * n, "name": ["cudaLaunchKernel"] * n, "pid": ops["pid"], "tid": ops["tid"],
                            "start_ns": launch_at, "dur_ns": [4_000] * n, "correlation": corr}).with_columns(
        *(pl.lit(None).alias(c) for c in t.cpu.columns if c not in ("cat", "name", "pid", "tid", "start_ns", "dur_ns", "correlation")))
    rows = [runtime.select(t.cpu.columns).cast(t.cpu.schema)]
    if sync:
        inf = Context(t).inference
        ends = inf.forwards["end_ns"]
        rows.append(pl.DataFrame({"cat": ["cuda_runtime"] * ends.len(), "name": ["cudaStreamSynchronize"] * ends.len(),
                                  "pid": [int(t.cpu["pid"][0])] * ends.len(), "tid": [int(ops["tid"][0])] * ends.len(),
                                  "start_ns": ends - 30_000, "dur_ns": [25_000] * ends.len()}).with_columns(
            *(pl.lit(None).alias(c) for c in t.cpu.columns if c not in ("cat", "name", "pid", "tid", "start_ns", "dur_ns"))
        ).select(t.cpu.columns).cast(t.cpu.schema))
    cpu = pl.concat([t.cpu, *rows]).sort("start_ns")
    gpu = pl.DataFrame({"kind": ["kernel"] * n, "name": ["gemv_kernel"] * n, "device": [0] * n, "stream": [7] * n,
                        "start_ns": launch_at + 5_000, "dur_ns": [int(kernel_us * 1e3)] * n, "correlation": corr}).with_columns(
        *(pl.lit(None).alias(c) for c in t.gpu.columns if c not in ("kind", "name", "device", "stream", "start_ns", "dur_ns", "correlation"))
    ).select(t.gpu.columns).cast(t.gpu.schema)
    devices = pl.DataFrame([{"device": 0, "name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "compute_major": 9, "compute_minor": 0,
                             "total_memory_bytes": 80 << 30, "max_threads_per_sm": 2048, "regs_per_sm": 65536,
                             "shared_mem_per_sm_bytes": 233472}], schema=t.devices.schema)
    return type(t)(gpu, cpu, t.steps, devices, t.meta, t.comms)


def test_on_a_gpu_decode_launch_bound_and_a_per_token_sync_are_found(traces):
    t = _on_a_gpu(traces["cache-b4"], kernel_us=3.0, sync=True)
    rep = proflab.analyze(t)
    inf = rep.summary["inference"]
    dec = inf["utilisation"]["decode"]
    # each decode forward's kernels: 15 GEMMs and 2 attentions of 3 us each
    assert dec["gpu_ms_per_forward"] == pytest.approx(0.051, abs=1e-3)
    assert dec["hbm_peak_gbps"] == 3350 and dec["mbu_pct"] is not None and dec["mbu_pct"] < 1
    found = {f.id: f for f in rep.findings}
    launch = found["decode_launch_bound"]
    assert launch.category == "launch_bound" and launch.where["phase"] == ["decode"] and launch.est_gain_ms > 0
    sync = found["per_token_sync"]
    assert sync.category == "sync_bound" and sync.evidence["syncs_per_token_median"] == 1 and sync.overlaps == ("sync_bound",)
    # no steps in the trace: its tokens are its steps, and each fix is replayed per token
    assert inf["tokens_as_steps"] and rep.summary["step_count"] == inf["forwards"]
    assert sync.prediction["model"] == launch.prediction["model"] == "replay"
    assert 0 < sync.est_gain_ms < sync.evidence["idle_after_sync_ms"] / (inf["forwards"] - 1) * 1.5
    assert sync.evidence["idle_after_sync_ms"] > 10 * sync.evidence["sync_wait_ms"]
    assert "decode_far_from_roof" not in found  # the GPU idles: launches, not bandwidth, set the pace
    # with the GPU busy through each token (long kernels), decode is far from the memory roof instead
    busy = proflab.analyze(_on_a_gpu(traces["cache-b4"], kernel_us=120.0, sync=False))
    ids = {f.id for f in busy.findings}
    assert "decode_far_from_roof" in ids and "decode_launch_bound" not in ids and "per_token_sync" not in ids


def test_a_compiled_decode_is_found_from_its_compiled_regions(views, traces):
    """A static cache with generate()'s own torch.compile of the decode: the decode forwards run
    as compiled regions (Torch-Compiled Region), their operators not in the trace."""
    inf = views["static-compile-b1"]
    f = inf.forwards
    assert f.height == 20 and f["phase"].to_list() == ["prefill"] + ["decode"] * 19 and f["generation"].n_unique() == 1
    assert f["q_len"][0] == 96 and f["q_len"][1:].null_count() == 19 and not f["recompute"].any()
    assert any("19 forwards ran compiled" in m for m in inf.missing)
    dec = inf.utilisation["decode"]
    assert dec["weight_bytes_per_forward"] == _weights_bytes() and dec["kv_bytes_per_forward"] is None
    assert "weights only, a lower bound" in dec["basis"]
    # compiled, the decode token is quicker than eager's with the same cache kind (both profiled)
    assert inf.latency["itl_median_ms"] < views["cache-b1"].latency["itl_median_ms"]
    assert not [x for x in proflab.analyze(traces["static-compile-b1"]).findings if x.category == "kv_cache_recompute"]


def test_each_figure_is_said_once_in_the_terminal(traces):
    from proflab.render.terminal import render_terminal

    text = render_terminal(_report(traces, "nocache-b1"), width=200)
    assert text.count("unprofiled (estimated): ") == 1 and text.count("Inference: ") == 1
    # the central estimates beside the ranges: TTFT, TPOT and tokens/s, each once
    line = next(x for x in text.splitlines() if "unprofiled (estimated): " in x)
    lat = _report(traces, "nocache-b1").summary["inference"]["latency"]
    assert f"TPOT {lat['unprofiled_tpot_ms']:g} ms" in line.replace(",", "") and "inter-token" in line
    assert text.count("output tokens/s") == 2  # the profiled run's and the estimate's


def test_a_trace_that_starts_mid_generation_says_so(traces):
    """A serving engine profiled while it serves: the window opens between two decode tokens."""
    t = traces["cache-b1"]
    inf = Context(t).inference
    cut = int(inf.forwards["end_ns"][4])  # drop the prefill and the first four tokens' work
    late = type(t)(t.gpu, t.cpu.filter(pl.col("start_ns") > cut), t.steps, t.devices, t.meta, t.comms)
    f = Context(late).inference
    assert f.forwards.height == 15 and (f.forwards["phase"] == "decode").all() and f.found
    assert f.latency["ttft_ms"] is None and f.latency["e2e_ms"] is None and f.latency["tpot_ms"] > 0
    assert any("starts inside a generation" in m for m in f.missing)


def test_shapes_that_are_not_shapes_are_left_out(traces):
    """A damaged trace's Input Dims (strings, deeper lists) never fail the report."""
    t = traces["cache-b1"]
    bad = pl.when(pl.col("name") == "aten::linear").then(pl.lit('[["a"],[[1,[2]]]]')).otherwise(pl.col("input_dims"))
    hostile = type(t)(t.gpu, t.cpu.with_columns(bad.cast(pl.Categorical).alias("input_dims")), t.steps, t.devices, t.meta, t.comms)
    inf = Context(hostile).inference
    # no aten::linear with readable shapes: the aten::mm under each gives the same forwards
    assert inf.found and inf.forwards.height == 20 and (inf.forwards["weight_bytes"] == _weights_bytes()).all()
    everything = hostile.cpu.with_columns(pl.lit('[["a"]]', pl.Categorical).alias("input_dims"))
    assert "inference" not in proflab.analyze(type(t)(t.gpu, everything, t.steps, t.devices, t.meta, t.comms)).summary


def test_on_a_gpu_recompute_is_claimed_only_where_its_kernels_do_the_work(traces):
    """Without a cache on a GPU, a forward's kernels at one token take at least a short kernel's
    time: where they already do (3 us each), recomputing costs nothing and nothing is claimed;
    where they are long (a ms each, outlasting the host), the saving is theirs: each forward takes
    the longer of its unprofiled host time and its GPU time, cached and not."""
    short = proflab.analyze(_on_a_gpu(traces["nocache-b4"], kernel_us=3.0, sync=False))
    assert not [f for f in short.findings if f.category == "kv_cache_recompute"]
    assert any(m["signal"] == "recompute cost" for m in short.to_dict()["missing"])
    t = _on_a_gpu(traces["nocache-b4"], kernel_us=1000.0, sync=False)
    (f,) = [f for f in proflab.analyze(t).findings if f.category == "kv_cache_recompute"]
    inf = Context(t).inference
    dec = inf.forwards.filter(pl.col("recompute"))
    # the host at the profiler's cheapest per-event cost (the low end: the most GPU work hidden);
    # cached, the forward keeps 17 kernels of at most 5 us (the trace's least kernel time)
    low = inf.event_cost_us[0]  # (the trace's own, event_cost.measure)
    host = np.maximum(dec["host_ms"].to_numpy() - (dec["events"].to_numpy() * low + dec["py_events"].to_numpy() * 0.2) / 1e3,
                      dec["events"].to_numpy() * 1e-3)
    gpu = dec["gpu_ms"].to_numpy()
    saving = np.maximum(host, gpu) - np.maximum(host, 17 * 5e-3)
    assert f.evidence["time_basis"].startswith("GPU kernel time against the unprofiled host time")
    assert f.est_gain_ms == pytest.approx(float(saving.sum()), rel=0.02)
    lo, hi = f.prediction["predicted_gain_range_ms"]
    assert lo == f.est_gain_ms <= hi


def test_on_an_h100_a_host_that_outlasts_the_gpu_hides_the_recomputation():
    """Hugging Face generate() without a cache on an H100 (tests/data/inference/h100): each token's
    host time (~11 ms profiled, ~1,760 events) outlasts its 1-4 ms of kernels at every batch, and
    bare, use_cache=True made the tokens no faster (6.17 -> 6.48 ms median inter-token gap at batch
    1, the same at 8 and 32). Nothing is claimed;
    the note says the host hides the work and gives the range."""
    h100 = Path(__file__).parent / "data" / "inference" / "h100"
    for b in (1, 8, 32):
        rep = proflab.analyze(proflab.load(h100 / f"nocache-b{b}.pt.trace.json.xz"))
        assert not [f for f in rep.findings if f.category == "kv_cache_recompute"], b
        (note,) = [m for m in rep.to_dict()["missing"] if m["signal"] == "recompute cost"]
        assert "outlasts the GPU" in note["reason"], note


def test_with_a_step_a_token_the_decode_fixes_are_replayed(traces):
    """A loop that calls proflab.step() (or prof.step()) once a token: the what-if model replays
    each token with the decode findings' fixes (CUDA graph, no per-token sync), per step."""
    g = _on_a_gpu(traces["cache-b4"], kernel_us=3.0, sync=True)
    f = Context(g).inference.forwards
    steps = pl.DataFrame({"step": range(f.height), "start_ns": f["start_ns"], "end_ns": f["end_ns"]}).cast(g.steps.schema)
    rep = proflab.analyze(type(g)(g.gpu, g.cpu, steps, g.devices, g.meta, g.comms))
    found = {x.id: x for x in rep.findings}
    for fid in ("decode_launch_bound", "per_token_sync"):
        assert found[fid].prediction["model"] == "replay" and 0 < found[fid].est_gain_ms < float(f["interval_ms"].median())
    assert rep.summary["inference"]["forwards"] == 20


def test_without_steps_the_tokens_are_the_steps(traces):
    """No proflab.step(): the generation's forwards become the trace's steps, a token a step, and
    the report is the one the same trace gives with those steps recorded."""
    g = _on_a_gpu(traces["cache-b4"], kernel_us=3.0, sync=True)
    assert g.steps.height == 0
    auto = proflab.analyze(g)
    f = Context(g).inference.forwards
    steps = pl.DataFrame({"step": range(f.height), "start_ns": f["start_ns"], "end_ns": f["end_ns"]}).cast(g.steps.schema)
    given = proflab.analyze(type(g)(g.gpu, g.cpu, steps, g.devices, g.meta, g.comms))
    assert auto.summary["inference"]["tokens_as_steps"] and not given.summary["inference"]["tokens_as_steps"]
    gains = {x.id: x.est_gain_ms for x in auto.findings}
    assert gains and gains == {x.id: x.est_gain_ms for x in given.findings}
    # a trace that is not a generation loop keeps its own (no) steps
    t = proflab.load(Path(__file__).parent / "data" / "kineto" / "train_loop.pt.trace.json.gz")
    assert proflab.analyze(t).summary["step_count"] == t.steps.height


def test_the_top_modules_forward_ends_each_token_in_a_fresh_run(tmp_path):
    """A tiny Llama generating under torch.profiler with module ranges (with_stack): each call of
    the top module (LlamaForCausalLM, once a token) is a forward, ending where the call returns
    (after its LM head); without the ranges the LM head gives the same forwards."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=512, max_position_embeddings=128,
                                   attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(3, 500, (2, 10))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, **kw)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                    with_stack=True) as prof:
            model.generate(ids, **kw)
    prof.export_chrome_trace(str(tmp_path / "gen.pt.trace.json"))
    t = proflab.load(tmp_path / "gen.pt.trace.json")
    inf = Context(t).inference
    assert inf.forwards_from == "top module LlamaForCausalLM"
    assert inf.forwards["phase"].to_list() == ["prefill"] + ["decode"] * 7 and (inf.forwards["batch"] == 2).all()
    calls = t.cpu.filter(pl.col("name").str.starts_with("nn.Module: LlamaForCausalLM"))
    assert inf.forwards["end_ns"].to_list() == sorted((calls["start_ns"] + calls["dur_ns"]).to_list())
    heads = Context(type(t)(t.gpu, t.cpu.filter(pl.col("cat") != "python_function"), t.steps, t.devices, t.meta,
                            t.comms)).inference
    assert heads.forwards_from == "LM head" and heads.forwards.height == 8
    assert (heads.forwards["end_ns"] <= inf.forwards["end_ns"]).all()
    rep = proflab.analyze(t)
    assert rep.summary["step_count"] == 8 and rep.summary["inference"]["tokens_as_steps"]


PADDED = Path(__file__).parent / "data" / "inference_padding"


def test_a_padded_batch_is_told_padded_and_no_waste_is_claimed(traces):
    """A batch of 4 prompts (4, 9, 16 and 24 tokens) left-padded to 24, one sequence ending at EOS
    while the others go on (tests/data/record/record_padding.py): a third of the positions computed
    were padding (padding.json, from the mask and the output), but a trace holds the mask's shape,
    not its values. The report says the batch is padded, and claims no gain."""
    truth = json.loads((PADDED / "padding.json").read_text())
    assert truth["real_positions"] < 0.75 * truth["computed_positions"]  # the waste is there
    t = proflab.load(PADDED / "padded-b4.pt.trace.json.gz")
    inf = Context(t).inference
    f = inf.forwards
    # SDPA with a mask folds the query's head groups into its length: the decode is still one position
    assert f["phase"].to_list() == [x["phase"] for x in truth["forwards"]]
    assert f["q_len"].to_list() == [truth["padded_to"]] + [1] * (f.height - 1) and (f["batch"] == 4).all()
    assert f["att_mask"].all()
    rep = proflab.analyze(t)
    assert "padding_waste" not in {x.id for x in rep.findings}
    (pad,) = [m for m in rep.to_dict()["missing"] if m["signal"] == "pad tokens"]
    assert f"mask tensor in {f.height} of {f.height} forwards: the batch is padded" in pad["reason"]
    # the same model unpadded (every mask position 1): the attention takes no mask
    (plain,) = [m for m in _report(traces, "cache-b4").to_dict()["missing"] if m["signal"] == "pad tokens"]
    assert "took no mask in any of 20 forwards" in plain["reason"]


def test_the_recorder_times_the_variants_in_turn_and_profiles_each_between_its_bare_runs(tmp_path):
    """record_inference.py on the CPU, two variants, three rounds: each variant's bare runs are
    one per round (so a drift of the host falls on both alike), the middle round profiles each
    once with the same streamer (its own figures kept beside the bare runs just before and after
    it), and the trace it wrote is read as a generation loop of as many tokens."""
    pytest.importorskip("transformers", reason="the recorder runs Hugging Face generate()")
    import subprocess
    import sys

    recorder = Path(__file__).resolve().parent / "data" / "record" / "record_inference.py"
    done = subprocess.run([sys.executable, str(recorder), "--out", str(tmp_path), "--batch", "1", "--variants", "nocache",
                           "cache", "--new-tokens", "4", "--prompt", "16", "--repeats", "3", "--compress", "gz"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert truth["protocol"].startswith("interleaved")
    cases = {c["case"]: c for c in truth["cases"]}
    assert set(cases) == {"nocache-b1", "cache-b1"}
    for name, c in cases.items():
        assert len(c["bare_runs"]) == 3 and c["profiled_round"] == 1 and c["profiled"]["new_tokens"] == 4
        near = sorted(r["tpot_ms"] for r in c["bare_runs"][1:3])
        assert near[0] <= c["bare_around_profiled"]["tpot_ms"] <= near[1]
        lat = proflab.analyze(tmp_path / f"{name}.pt.trace.json.gz").summary["inference"]["latency"]
        assert lat["tokens_per_sequence"] == 4
