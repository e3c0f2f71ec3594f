"""The profiler's per-event cost, measured from the trace (``analysis.timeline.event_cost``), on
traces recorded on an H100 beside bare timings of the same program (tests/data/inference/h100)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import polars as pl
import pytest

import proflab
from proflab.analysis.timeline.event_cost import DEFAULT, EventCost, combined, measure
from committed import committed  # noqa: E402  (tests/, on the path)

H100 = Path(__file__).parent / "data" / "inference" / "h100"
TRUTH = {c["case"]: c for c in json.loads((H100 / "truth.json").read_text())["cases"]}


@pytest.fixture(scope="module")
def reports():
    return {}


def _report(reports, case: str):
    if case not in reports:
        reports[case] = proflab.analyze(proflab.load(committed(H100, case)))
    return reports[case]


def _bare_itl_ms(case: str) -> float:
    return statistics.median(x for r in TRUTH[case]["bare_runs"] for x in r["itl_ms"])


def test_the_cost_the_bare_tokens_put_on_an_event_is_the_gaps_mean(reports):
    """generate() with the dynamic cache at batch 1: the profiled inter-token time less the bare
    one, over the events of a token, is what each recorded event cost (3.20 us). The gaps' mean
    plus the insides' mean (the range's high end, 3.26 us) is within 10% of it: the profiler's
    cost over a token is the sum of its events'. The usual event's (the medians' sum, 1.85 us, the
    low end) is not: an estimate at it left 40% of the profiler's cost in the unprofiled token."""
    cost = measure(proflab.load(committed(H100, "cache-b1")))
    assert cost.source == "measured" and cost.pairs > 5000
    lat = _report(reports, "cache-b1").summary["inference"]["latency"]
    per_event_us = (lat["itl_median_ms"] - _bare_itl_ms("cache-b1")) / lat["events_per_decode_forward"] * 1e3
    assert per_event_us == pytest.approx(3.20, abs=0.02)
    assert cost.hi_us == pytest.approx(per_event_us, rel=0.10) == cost.gap_mean_us + cost.inside_mean_us
    assert cost.lo_us == pytest.approx(cost.gap_us + cost.inside_us) and cost.lo_us < 0.65 * per_event_us
    assert 0 < cost.inside_us < cost.gap_us and cost.gap_us < cost.gap_mean_us
    assert f"the estimate at {cost.hi_us:.2f} us, the gaps' mean" in lat["unprofiled_basis"]


@pytest.mark.parametrize("case", ["nocache-b1", "cache-b8", "cache-b32", "nocache-b32", "static-compile-b1"])
def test_the_unprofiled_latency_is_within_10_percent_of_the_bare_run(reports, case):
    """TPOT and tokens/s with the measured per-event cost taken off each forward, against the
    same generate() timed bare with CUDA events (issue 57's bar), on five of the nine
    156 M-parameter cases (the others: benchmarks/inference_truth.py); the report states the
    cost it took off."""
    lat = _report(reports, case).summary["inference"]["latency"]
    bare = TRUTH[case]["bare_median"]
    assert lat["unprofiled_tpot_ms"] == pytest.approx(bare["tpot_ms"], rel=0.10)
    assert lat["unprofiled_output_tokens_per_s"] == pytest.approx(bare["output_tokens_per_s"], rel=0.10)
    assert lat["tpot_ms"] > 1.2 * bare["tpot_ms"]  # (the profiled figure is not: the profiler's cost is in it)
    assert "per-event cost (" in lat["unprofiled_basis"] and "start-up cost on the first CUDA call" in lat["unprofiled_basis"]


def _ttft_miss(why: str):
    return pytest.mark.xfail(strict=True, reason=f"a known miss: {why} (benchmarks/inference_truth.py)")


# TTFT runs from the generation's first operator to the first token in the host's hands (the sync
# after the prefill forward, ``inference._token_out``); the bare TTFT from the streamer's prompt to
# its first token. Two cases stay short of the bare figure: their bare TTFTs spread widely over
# the rounds, and the trace holds one profiled prefill
@pytest.mark.parametrize("case", ["cache-b32", "nocache-b32", "nocache-b8",
                                  pytest.param("cache-b8", marks=_ttft_miss("7.05 ms against 8.26 bare (-15%); the bare "
                                               "TTFT spread 7.3-11.4 ms over the rounds")),
                                  pytest.param("static-compile-b1", marks=_ttft_miss("6.96 ms against 8.32 bare (-16%); the "
                                               "static cache's eager prefill; its bare TTFT spread 7.8-13.2 ms "
                                               "over the rounds"))])
def test_the_unprofiled_ttft_is_within_10_percent_of_the_bare_run(reports, case):
    """TTFT: the prefill forward less its events' cost and the profiler's start-up cost, the
    first CUDA call's (``event_cost.startup``). Without it the estimate was 24-26% high without
    a cache at batch 8 and 32 (8.48 and 8.63 ms against 6.83 and 6.84): generate()'s first
    operator, a scalar's host-to-device copy, took 1.7 ms under the profiler where its later
    calls take ~50 us, and the bare runs' first token took no longer than the next."""
    lat = _report(reports, case).summary["inference"]["latency"]
    bare = TRUTH[case]["bare_median"]
    assert lat["unprofiled_ttft_ms"] == pytest.approx(bare["ttft_ms"], rel=0.10)
    assert lat["ttft_ms"] > 1.3 * bare["ttft_ms"]


def test_the_first_token_is_out_when_the_host_has_it(reports):
    """The first token is out when the host holds it: the sync after the prefill forward (the
    streamer's copy, generate()'s EOS check), not the forward's LM head (its logits then still
    to be sampled and copied). The profiled run's own streamer stamped the token right after
    its copy: the report's first token ends at most 0.2 ms before that stamp, the LM head
    more than 1 ms before it; the tokens after it end each at their own sync alike, so
    the time per token is the same (cache-b1)."""
    trace = proflab.load(committed(H100, "cache-b1"))
    from proflab.analysis import Context

    f = Context(trace).inference.forwards
    lat = _report(reports, "cache-b1").summary["inference"]["latency"]
    first_out = f["start_ns"][0] + lat["ttft_ms"] * 1e6
    stamps = trace.cpu.filter(pl.col("name").str.starts_with("cudaEventRecord")).sort("start_ns")["start_ns"]
    token_stamp = stamps[1]  # (the streamer's first stamp is the prompt's)
    assert token_stamp - 0.2e6 < first_out <= token_stamp
    linears = trace.cpu.filter((pl.col("name") == "aten::linear") & (pl.col("start_ns") < token_stamp))
    assert (linears["start_ns"] + linears["dur_ns"]).max() < token_stamp - 1e6  # (the LM head, the prefill's last)
    # (the streamer's copy to pageable memory is itself synchronous: its end, just before the sync's)
    syncs = trace.cpu.filter(pl.col("name").is_in(["cudaStreamSynchronize", "cudaMemcpyAsync"]))
    ends = set((syncs["start_ns"] + syncs["dur_ns"]).to_list())
    assert all(int(t) in ends for t in f["end_ns"].head(5).to_list())
    tokens = stamps[1:-1]  # (then the streamer's end, at the last token)
    assert lat["tpot_ms"] == pytest.approx((tokens[-1] - tokens[0]) / (len(tokens) - 1) / 1e6, rel=0.02)


def test_the_profilers_start_up_is_measured_on_the_first_cuda_call(reports):
    """The first CUDA call the profiler traced (generate()'s first copy to the device): its
    operator's time past the median of its later calls of the same shapes, on the forward that
    made it and no other."""
    from proflab.analysis.timeline.event_cost import startup

    trace = proflab.load(committed(H100, "nocache-b8"))
    s = startup(trace)
    assert s is not None and s.op == "aten::copy_" and s.later >= 3
    assert 0.2e6 < s.excess_ns < 1.0e6  # (0.39 ms; 0.39-2.38 over the nine cases)
    first = trace.cpu.filter(pl.col("cat") == "cuda_runtime").sort("start_ns").head(1)["start_ns"][0]
    copies = trace.cpu.filter((pl.col("name") == "aten::copy_") & (pl.col("start_ns") <= first)
                              & (pl.col("start_ns") + pl.col("dur_ns") >= first))
    assert copies["start_ns"].to_list() == [s.at_ns]
    f = _report(reports, "nocache-b8")  # (the report's forwards carry it on the first only)
    from proflab.analysis import Context

    fw = Context(trace).inference.forwards
    assert fw["startup_ms"][0] == pytest.approx(s.excess_ns / 1e6) and fw["startup_ms"][1:].sum() == 0
    said = f.summary["inference"]["latency"]["profiler_startup"]  # (the report says what it took off)
    assert said == {"operator": "aten::copy_", "excess_us": round(s.excess_ns / 1e3, 1), "compared_with": s.later}
    assert f.summary["inference"]["latency"]["unprofiled_ttft_ms"] < f.summary["inference"]["latency"]["ttft_ms"]


def test_tokens_on_a_slowed_host_count_at_the_usual_tokens_time(reports):
    """generate() with a cache at batch 1: 2 of its 31 profiled decode tokens ran 1.3x the median
    token or more with the same events (each operator slower alike: the host's speed). Counted at
    the usual token's time, the unprofiled TPOT is within 10% of bare; at batch 32, where no token
    ran slowed, nothing is set aside."""
    lat = _report(reports, "cache-b1").summary["inference"]["latency"]
    bare = TRUTH["cache-b1"]["bare_median"]
    assert lat["host_slowed_tokens"] == 2 and "2 decode tokens ran on a slowed host" in lat["unprofiled_basis"]
    assert lat["unprofiled_tpot_ms"] == pytest.approx(bare["tpot_ms"], rel=0.10)
    assert lat["tpot_ms"] > 1.5 * bare["tpot_ms"]
    assert "host_slowed_tokens" not in _report(reports, "cache-b32").summary["inference"]["latency"]


def test_the_observer_states_the_cost_it_used(reports):
    obs = _report(reports, "cache-b1").summary["observer"]
    assert obs["event_cost"]["source"] == "measured"
    lo, hi = obs["event_cost"]["per_event_cost_us"]
    # the profiler's cost per step is the step's events at the range's ends
    assert obs["profiler_cost_ms_lo"] == pytest.approx(obs["events_per_step"] * lo / 1e3, rel=0.02)
    assert obs["profiler_cost_ms_hi"] == pytest.approx(obs["events_per_step"] * hi / 1e3, rel=0.02)


def test_without_nested_operators_the_model_range_stays(tmp_path):
    """Operators one after another, none inside another (no C++ operator calls another): the
    gaps between them hold the program's Python, not the profiler's callbacks alone, so the
    trace says nothing and the model's range (observer.EVENT_COST_US) is used."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 2.0}
              for i in range(1000)]
    f = tmp_path / "flat.pt.trace.json"
    f.write_text(json.dumps({"traceEvents": events}))
    assert measure(proflab.load(f)) == DEFAULT


def test_nested_operators_give_the_gaps_between_siblings(tmp_path):
    """``aten::linear`` calling ``aten::t`` (which calls ``aten::view``) then ``aten::addmm``, 400
    times: the gap between ``aten::t``'s end and ``aten::addmm``'s start (1.0 us three times in
    four, 5.0 the fourth) is the measurement, not the one from the view's end (inside
    ``aten::t``); the views' 0.4 us are the part inside; the 20 us between two linears (the
    program's Python) are not counted. The range runs from the usual event (the medians' sum: 1.4
    us) to the means' sum (2.4 us: what the events cost together)."""
    events, t = [], 0.0
    for i in range(400):
        gap = 5.0 if i % 4 == 3 else 1.0
        events += [
            {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 7, "ts": t, "dur": 10.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::t", "pid": 1, "tid": 7, "ts": t + 0.5, "dur": 1.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::view", "pid": 1, "tid": 7, "ts": t + 0.6, "dur": 0.4},
            {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 7, "ts": t + 1.5 + gap, "dur": 5.0},
        ]
        t += 30.0
    f = tmp_path / "nested.pt.trace.json"
    f.write_text(json.dumps({"traceEvents": events}))
    cost = measure(proflab.load(f))
    assert cost.source == "measured" and cost.pairs == 400
    assert cost.inside_us == pytest.approx(0.4) and cost.gap_us == pytest.approx(1.0) and cost.gap_mean_us == pytest.approx(2.0)
    assert (cost.lo_us, cost.hi_us) == pytest.approx((1.4, 2.4))
    assert cost.to_dict()["gap_mean_us"] == 2.0 and cost.to_dict()["no_work_operator_mean_us"] == 0.4


def test_parts_combine_to_the_median_of_their_ends():
    a = EventCost(1.0, 2.0, "measured", gap_us=0.8, inside_us=0.4, pairs=300)
    b = EventCost(1.4, 3.0, "measured", gap_us=1.0, inside_us=0.5, pairs=500)
    c = combined([a, b, DEFAULT])
    assert (c.lo_us, c.hi_us, c.pairs, c.source) == (1.2, 2.5, 800, "measured")
    assert combined([DEFAULT]) == DEFAULT == combined([])


def test_the_replay_and_the_latency_take_the_same_cost_per_event(reports):
    """generate() with a cache at batch 1 (its tokens the steps): without a measured step, the
    what-if replay's bare step takes the measured cost's high end, the gaps' mean (at the range's
    middle it said 7.80 ms), and the unprofiled latency is read from the same replay's tokens:
    the report's step without the profiler (their median, 6.53 ms) and its unprofiled TPOT
    (their mean, 6.69 ms) are one estimate, both within 10% of bare (7.20 ms)."""
    s = _report(reports, "cache-b1").summary
    pred, lat = s["predicted"], s["inference"]["latency"]
    assert pred["bare_step_source"] == "estimated" and lat["unprofiled_basis"].startswith("replayed: ")
    assert pred["bare_step_ms"] == pytest.approx(pred["calibration"]["bare_replay_range_ms"][0], rel=1e-3)
    assert pred["bare_step_ms"] == pytest.approx(lat["unprofiled_tpot_ms"], rel=0.05)
    for x in (pred["bare_step_ms"], lat["unprofiled_tpot_ms"]):
        assert x == pytest.approx(TRUTH["cache-b1"]["bare_median"]["tpot_ms"], rel=0.10)


def test_a_token_whose_kernels_outlast_the_faster_host_is_replayed():
    """TinyLlama without a cache at batch 8 (tests/data/inference/h100-rounds): 7.3 ms of kernels
    a token, a host twice as fast without the profiler. Taking the profiler's cost off each
    forward's interval (floored at its GPU time) leaves 12.47 ms a token, 11% under the bare
    14.03: the GPU's share of the token is on its critical path once the host is faster. The
    what-if replay of the bare plan, launch against kernel, says 12.84 ms (-8.5%)."""
    from proflab.analysis import Context

    rounds = H100.parent / "h100-rounds"
    bare = {c["case"]: c for c in json.loads((rounds / "truth.json").read_text())["cases"]}["l3-nocache-b8"]["bare_median"]
    trace = proflab.load(committed(rounds, "l3-nocache-b8"))
    subtracted = Context(trace).inference.latency["unprofiled_tpot_ms"]
    lat = proflab.analyze(trace).summary["inference"]["latency"]
    assert subtracted < 0.9 * bare["tpot_ms"]
    assert lat["unprofiled_tpot_ms"] == pytest.approx(bare["tpot_ms"], rel=0.10) and lat["unprofiled_tpot_ms"] > subtracted
    lo, hi = lat["unprofiled_itl_median_ms_range"]
    assert lo <= subtracted <= hi  # (the range still the cost range's ends)
