"""Job-level diagnoses across ranks: ``load_imbalance`` and ``communication_bound``.

``rule(tables, summaries) -> list[Finding]`` over the cross-rank tables of
``analysis.ranks``. Gains are the job's time, counted once: ranks run in lockstep through
their collectives, so a delay every rank waits for is saved once, not once per rank. The
window they are measured against is the ranks' median analysed window.

A collective's time on a rank that waited for a late peer is the late rank's cost
(``load_imbalance``); only the transfer after the last arrival, where no compute hid it, is
communication's (``communication_bound``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import polars as pl

from proflab.analysis.devices import datasheet_peaks
from proflab.analysis.ranks import JobTables, RankSummary, link_reference
from proflab.analysis.whatif.job import JobWhatIf
from proflab.model.findings import Finding, Fix
from proflab.rules._common import MIN_GAIN_PCT, WARNING_PCT, gain_finding, ms, pct, severity, with_try

__all__ = ["job_rules", "load_imbalance", "communication_bound", "job_wall_ns"]


def job_wall_ns(summaries: list[RankSummary]) -> int:
    w = [s.stats["window_ns"] for s in summaries if s.stats.get("window_ns")]
    return int(np.median(w)) if w else 0


def job_rules(tables: JobTables, summaries: list[RankSummary]) -> list[Finding]:
    jw = job_whatif(summaries)
    out = [*load_imbalance(tables, summaries, jw), *communication_bound(tables, summaries, jw)]
    out = [f if f.prediction is not None or not f.est_gain_ms else _per_step(f, tables) for f in out]
    out.sort(key=lambda f: (-f.est_gain_ms, f.id))
    return out


def job_whatif(summaries: list[RankSummary]) -> JobWhatIf:
    """The ranks replayed together (``analysis.whatif.job``); the job's measured bare step
    is its slowest rank's, where every rank measured its own."""
    bare = [s.stats.get("bare_step_ms") for s in summaries]
    measured = max(bare) if bare and all(isinstance(b, (int, float)) and b > 0 for b in bare) else None
    return JobWhatIf({s.rank: s.whatif for s in summaries}, measured)


def _job_predicted(f: Finding, jw: JobWhatIf | None, fixes: dict) -> Finding:
    """``f`` with the bare job step its fix saves, the ranks replayed together; as it is
    (the idle model, per step in ``job_rules``) where they cannot be."""
    p = jw.predict(fixes) if jw is not None and fixes else None
    if p is None:
        return f
    return dataclasses.replace(
        f, severity=severity(p.gain_pct), est_gain_ms=p.gain_ms, est_gain_pct=p.gain_pct, prediction=p.to_dict(),
        assumption=f.assumption + "; predicted by replaying every rank's bare step with the fix, collectives in lockstep",
    )  # fmt: skip


def _per_step(f: Finding, tables: JobTables) -> Finding:
    """A job finding's idle-time gain over the window, per step of the job."""
    coll = tables.collectives
    steps = int(coll.filter(pl.col("step") >= 0)["step"].n_unique()) if coll.height else 0
    return dataclasses.replace(
        f, est_gain_ms=f.est_gain_ms / steps if steps else f.est_gain_ms,
        prediction={"model": "idle time", "per": "step" if steps else "window", "no_replay": "the ranks' steps could not be replayed together"},
    )  # fmt: skip


def _leads(waits: pl.DataFrame) -> pl.DataFrame:
    """Per (step, rank): how much later than every other rank it arrived at its latest
    collective of the step (0 when it was never last)."""
    per = waits.group_by("group", "step", "seq").agg(
        pl.col("last_rank").first().alias("rank"),
        (pl.col("start_ns").max() - pl.col("start_ns").sort().reverse().get(1)).alias("lead_ns"),
    )
    if (per["step"] < 0).all():
        # no profiler steps: each collective stands for a step (one outlier must not decide)
        per = per.with_columns(pl.col("seq").alias("step"))
    return per.group_by("step", "rank").agg(pl.col("lead_ns").max())


def load_imbalance(tables: JobTables, summaries: list[RankSummary], jw: JobWhatIf | None = None) -> list[Finding]:
    w = tables.waits
    if w.height == 0 or len(summaries) < 2:
        return []
    wall = job_wall_ns(summaries)
    leads = _leads(w)
    steps = leads["step"].unique().sort().to_list()
    total = leads.group_by("rank").agg(pl.col("lead_ns").sum()).sort("lead_ns", descending=True)
    slow = int(total["rank"][0])
    per_step = {s: 0 for s in steps}
    for s, v in leads.filter(pl.col("rank") == slow).select("step", "lead_ns").iter_rows():
        per_step[s] = int(v)
    values = np.array(list(per_step.values()), dtype=np.int64)
    # the typical step, not one outlier: a profiler flush or a one-off hiccup on one step
    # is not a straggler
    typical_ns = float(np.median(values))
    gain_ns = typical_ns * len(values)
    if wall == 0 or pct(gain_ns, wall, 2) < MIN_GAIN_PCT:
        return []
    # A collective ends at about the same instant on every rank: how far the ends disagree
    # is the noise of comparing the ranks' times (clocks, completion). A lead within twice
    # that, or a rank that is last in only half the steps, is jitter, not a straggler.
    spread_ns = float(tables.collectives["end_spread_ns"].median() or 0)
    if typical_ns <= 2 * spread_ns or (values > 0).sum() * 2 <= len(values):
        return []
    by_rank = {s.rank: s for s in summaries}
    rt = tables.ranks
    others = [r for r in by_rank if r != slow]
    waited = {
        r: float(w.filter((pl.col("rank") == r) & (pl.col("last_rank") == slow))["wait_ns"].sum()) for r in others
    }
    cause, explain = _cause(by_rank[slow], [by_rank[r] for r in others], typical_ns)
    coll = tables.collectives
    skew = coll["skew_ns"].cast(pl.Float64)
    ev: dict[str, Any] = {
        "slow_rank": slow,
        "late_per_step_ms": ms(typical_ns),
        "steps_late": int((values > 0).sum()),
        "steps_matched": len(values),
        "others_wait_ms": {str(r): ms(v) for r, v in waited.items()},
        "skew_median_ms": ms(skew.median()),
        "skew_p90_ms": ms(skew.quantile(0.9, "linear")),
        "skew_max_ms": ms(skew.max()),
        "collectives_matched": coll.height,
        "end_spread_median_us": None if coll.height == 0 else round(float(coll["end_spread_ns"].median()) / 1e3, 2),
        "cause": cause,
        **explain,
    }
    slow_row = rt.filter(pl.col("rank") == slow).to_dicts()[0] if rt.height else {}
    if slow_row.get("side") == "gpu":
        ev["others_nccl_wait_note"] = "on the waiting ranks this is NCCL kernel time spent waiting for rank %d, not communication cost" % slow
    fix = _IMBALANCE_FIX[cause].format(rank=slow, **{k: v for k, v in explain.items() if isinstance(v, (int, float))})
    # `proflab run` measured every rank's step without the profiler: a lead longer than the
    # whole unprofiled step cannot be what the loop does (a disturbed window: the profiler's
    # cost, a machine busy with other work); nothing is claimed for it
    where = {"ranks": [slow], "steps": [s for s, v in per_step.items() if v > 0]}

    def unconfirmed(title: str, fix_first: str, assumption: str) -> list[Finding]:
        return [Finding(id="load_imbalance_unconfirmed", category="load_imbalance", severity="info", title=title,
                        evidence=ev, est_gain_ms=0.0, est_gain_pct=0.0, fix=fix_first + fix, where=where,
                        assumption=assumption)]  # fmt: skip

    bare = [s.stats.get("bare_step_ms") for s in summaries]
    if all(isinstance(b, (int, float)) and b > 0 for b in bare) and typical_ns / 1e6 >= max(bare):
        ev["bare_step_ms_per_rank"] = {str(s.rank): round(float(b), 3) for s, b in zip(summaries, bare)}
        return unconfirmed(
            f"Rank {slow} reaches the collectives {ms(typical_ns, 2)} ms per step late in the window, longer than the "
            f"whole step without the profiler ({max(bare):.2f} ms): the window was disturbed, not the loop",
            "Record again on a quiet machine (nothing else on the ranks' cores) and compare; ",
            f"no gain claimed: unprofiled, every rank's median step ({', '.join(f'{b:.2f}' for b in bare)} ms) is shorter "
            f"than the lead measured in the window",
        )
    obs = (getattr(by_rank[slow].report, "summary", None) or {}).get("observer") or {}
    if cause in ("dispatch", "host") and obs.get("unprofiled_host_ms_lo") is not None and obs.get("gpu_work_ms") is not None:
        ev["unprofiled_host_ms_lo"] = obs["unprofiled_host_ms_lo"]
        ev["gpu_work_ms"] = obs["gpu_work_ms"]
        if obs["unprofiled_host_ms_lo"] <= obs["gpu_work_ms"]:
            # its own report's observer: unprofiled, its host keeps ahead of its GPU; the
            # profiler's own cost may be what makes this rank late (see analysis.timeline.observer).
            # Host work that launches nothing (a sleep, I/O) counts in its host work too: a
            # delay that still fits within the GPU's queue never reaches the collectives.
            return unconfirmed(
                f"Rank {slow} reaches the collectives {ms(typical_ns, 2)} ms per step late because its GPU waits "
                "for its host, which the profiler's own cost may explain",
                "Measure the step time without the profiler on every rank (--bare-step-ms) before acting; ",
                f"no gain claimed: unprofiled, rank {slow}'s host work per step ({obs['unprofiled_host_ms_lo']} ms with the "
                f"largest plausible profiler cost taken out) fits within its GPU work ({obs['gpu_work_ms']} ms)",
            )
    target = {"host": "quiet", "dataloader": "loader"}.get(cause)
    fixes = {slow: [Fix("remove_host_work", target, label=f"rank {slow}'s extra host work off its loop")]} if target else {}
    return [
        _job_predicted(gain_finding(
            "load_imbalance",
            gain_ns,
            wall,
            title=(
                f"Rank {slow} is the straggler: the other ranks wait {ms(typical_ns, 2)} ms per step for it at the collectives"
                + (f" ({_CAUSE_WORDS[cause]})" if cause != "unknown" else "")
            ),
            evidence=ev,
            fix=fix,
            where=where,
            assumption=(
                f"the job saves rank {slow}'s typical lead per step (median over {len(values)} matched steps) "
                "if it arrived with the others; counted once for the job, not per waiting rank"
            ),
        ), jw, fixes)
    ]


_CAUSE_WORDS = {
    "host": "host work that launches nothing on its loop thread",
    "dataloader": "waiting for its DataLoader",
    "compute": "more compute than the other ranks",
    "dispatch": "its GPU waits longer for its host to launch work",
    "unknown": "",
}
_IMBALANCE_FIX = {
    "host": (
        "Rank {rank}'s loop thread spends {slow_host_ms_per_step} ms per step in host work that launches nothing "
        "(sleep, I/O, logging, the program's own Python) that the other ranks do not do: remove it from the training step, "
        "do it on every rank's spare time (a background thread), or only every N steps; a rank-0-only (or rank-N-only) "
        "checkpoint, evaluation or logging block is the usual culprit."
    ),
    "dataloader": (
        "Rank {rank} waits {slow_dataloader_ms_per_step} ms per step for its DataLoader: raise num_workers, set "
        "pin_memory=True and persistent_workers=True, prefetch_factor, and check that its shard is not slower to read "
        "(same storage, same preprocessing cost)."
    ),
    "compute": (
        "Rank {rank} computes {slow_compute_excess_ms_per_step} ms more per step than the others: balance the work per "
        "rank (equal batch sizes, sequence lengths bucketed so ranks get equal tokens), and check its GPU for lower "
        "clocks or throttling (proflab run's monitor)."
    ),
    "dispatch": (
        "Rank {rank}'s GPU idles {slow_dispatch_excess_ms_per_step} ms per step longer than the others' waiting for its "
        "host to launch work (its own report's launch/host findings say why): its host is slower or busier; check what "
        "else runs on its CPU cores (pin each rank to its own cores, OMP_NUM_THREADS), and the fixes for launch overhead "
        "(CUDA graphs, torch.compile) shorten every rank's dispatch. Under the profiler, a rank whose host records more "
        "events is slowed more: confirm with an unprofiled run."
    ),
    "unknown": (
        "Rank {rank} arrives late at the collectives but its trace shows no extra host work, data loading or compute: "
        "compare the ranks' step breakdowns below, and look for a slower GPU (clocks, thermal), a busier host, or "
        "rank-specific code paths."
    ),
}


def _cause(slow: RankSummary, others: list[RankSummary], lead_ns: float) -> tuple[str, dict[str, Any]]:
    """What the late rank does more than the others, per step, from its own trace."""

    def per_step(s: RankSummary, col: str) -> float:
        return float(s.steps[col].median()) if s.steps.height else 0.0

    ex: dict[str, Any] = {}
    cand = {}
    for cause, col in (("host", "host_only_ns"), ("dataloader", "dataloader_ns"), ("compute", "compute_ns")):
        mine = per_step(slow, col)
        theirs = float(np.median([per_step(o, col) for o in others])) if others else 0.0
        cand[cause] = mine - theirs
        label = {"host": "host", "dataloader": "dataloader", "compute": "compute"}[cause]
        ex[f"slow_{label}_ms_per_step"] = ms(mine, 2)
        ex[f"others_{label}_ms_per_step"] = ms(theirs, 2)
    ex["slow_compute_excess_ms_per_step"] = ms(cand["compute"], 2)

    def dispatch(s: RankSummary) -> float | None:
        # GPU idle while its host was dispatching or busy (gaps of cause host or launch)
        c = s.stats.get("idle_by_cause_ns")
        n = s.stats.get("steps") or 0
        return None if c is None or n == 0 else (c.get("host", 0) + c.get("launch", 0)) / n

    mine, theirs = dispatch(slow), [d for d in map(dispatch, others) if d is not None]
    if mine is not None and theirs:
        cand["dispatch"] = mine - float(np.median(theirs))
        ex["slow_gpu_idle_on_host_ms_per_step"] = ms(mine, 2)
        ex["others_gpu_idle_on_host_ms_per_step"] = ms(float(np.median(theirs)), 2)
        ex["slow_dispatch_excess_ms_per_step"] = ms(cand["dispatch"], 2)
    best = max(cand, key=cand.get)
    # the excess must explain at least half of the lateness to be named as its cause
    if lead_ns > 0 and cand[best] >= 0.5 * lead_ns:
        ex["cause_explains_pct"] = pct(cand[best], lead_ns)
        return best, ex
    return "unknown", ex


def communication_bound(tables: JobTables, summaries: list[RankSummary], jw: JobWhatIf | None = None) -> list[Finding]:
    rt = tables.ranks
    w = tables.waits
    if rt.height == 0 or w.height == 0:
        return []
    wall = job_wall_ns(summaries)
    exposed_ms = float(rt["exposed_transfer_ms"].median())
    starved = rt["starved_transfer_ms"].fill_null(0.0)
    starved_ms = float(starved.median())
    # A collective's transfer holds the job back where every rank has compute queued behind
    # it; where one rank's GPU had nothing queued (its host was behind, which the profiler's
    # own cost makes worse), that rank's host paces the job, not the transfer (analysis.ranks)
    per = (
        w.with_columns((pl.col("exposed_transfer_ns") - pl.col("starved_transfer_ns")).clip(0).alias("blocking_ns"))
        .group_by("group", "step", "seq")
        .agg(pl.col("blocking_ns").min(), pl.col("transfer_ns").median(), pl.col("start_ns").min())
    )
    # never more than the median rank's exposed union (a CPU backend's collectives overlap
    # on several threads: their per-call sums count the same time twice)
    blocking_ms = min(float(per["blocking_ns"].sum()) / 1e6, float((rt["exposed_transfer_ms"] - starved).median()))
    # the step's last collective has nothing left in the step to overlap with (DDP's last
    # bucket): its transfer is not claimed
    tail_ms = float(per.sort("start_ns").group_by("step").agg(pl.col("transfer_ns").last())["transfer_ns"].sum()) / 1e6
    gain_ns = max(blocking_ms - tail_ms, 0.0) * 1e6
    # if every exposed transfer held the job back, the last collectives' too: the most the
    # collectives can cost this window (an unprofiled run lands between the two); blocking
    # is part of it (starved >= 0), so never above
    upper_ms = exposed_ms
    if wall == 0 or pct(upper_ms * 1e6, wall, 2) < MIN_GAIN_PCT:
        return []
    if pct(gain_ns, wall, 2) < MIN_GAIN_PCT and pct(starved_ms * 1e6, wall, 2) < WARNING_PCT:
        return []
    coll = tables.collectives
    sized = coll.drop_nulls("bytes")
    # per step over the profiler's steps; collectives outside every step (the GPU's tail of
    # the step before the window) only count where the trace has no steps at all
    if (coll["step"] >= 0).any():
        coll_s, sized_s = coll.filter(pl.col("step") >= 0), sized.filter(pl.col("step") >= 0)
    else:
        coll_s, sized_s = coll, sized
    steps = max(int(coll_s["step"].n_unique()), 1)
    per_step_calls = coll_s.height / steps
    bytes_step = int(sized_s["bytes"].sum() / steps) if sized_s.height else None
    median_bytes = int(sized["bytes"].median()) if sized.height else None
    big = sized.filter(pl.col("bytes") >= 16 << 20).drop_nulls("busbw_gbps")
    busbw = float(big["busbw_gbps"].median()) if big.height else (float(sized["busbw_gbps"].drop_nulls().median()) if sized.height and sized["busbw_gbps"].drop_nulls().len() else None)
    device = next((s.stats.get("device_name") for s in summaries if s.stats.get("device_name")), None)
    link = link_reference(device)
    overlap = float(rt["overlap_pct"].drop_nulls().median()) if rt["overlap_pct"].drop_nulls().len() else None
    kinds = sorted(set(coll["collective"].drop_nulls().to_list()))
    dtypes = sorted({d for s in summaries for d in s.calls["dtype"].drop_nulls().to_list()})
    ev: dict[str, Any] = {
        "exposed_transfer_ms": round(exposed_ms, 3),
        "exposed_transfer_pct": pct(exposed_ms * 1e6, wall),
        "exposed_blocking_ms": round(blocking_ms, 3),
        "exposed_while_host_starved_ms": round(starved_ms, 3),
        "unavoidable_tail_ms": round(tail_ms, 3),
        "upper_bound_ms": round(upper_ms, 3),
        "comm_ms_per_rank_median": round(float(rt["comm_ms"].median()), 3),
        "wait_ms_per_rank_median": round(float(rt["wait_ms"].median()), 3),
        "overlap_pct": None if overlap is None else round(overlap, 1),
        "collectives_per_step": round(per_step_calls, 1),
        "bytes_per_step": bytes_step,
        "median_message_bytes": median_bytes,
        "collectives": kinds,
        "dtypes": dtypes,
        "busbw_gbps": None if busbw is None else round(busbw, 1),
        "link": None if link is None else link["link"],
        "link_gbps_per_direction": None if link is None else link["gbps_per_direction"],
        "busbw_of_link_pct": None if busbw is None or link is None else pct(busbw, link["gbps_per_direction"]),
    }
    if bytes_step is None:
        ev["missing"] = "message sizes (no record_param_comms metadata): bus bandwidth cannot be computed"
    fixes = []
    if overlap is not None and overlap < 60:
        how = []
        if "allreduce" in kinds:
            how.append(
                "DDP: let the all-reduces start during backward (find_unused_parameters=False, static_graph=True when "
                "the graph is fixed, no .item()/sync inside backward hooks)"
            )
        if "allgather" in kinds or "reducescatter" in kinds:
            how.append("FSDP: forward_prefetch=True and backward_prefetch=BACKWARD_PRE")
        if {"sendrecv", "send", "recv"} & set(kinds):
            how.append(
                "point-to-point (pipeline/context parallel): post sends and receives early with batch_isend_irecv "
                "and an interleaved schedule so compute runs while they transfer"
            )
        fixes.append(
            f"only {overlap:.0f}% of collective time runs under compute" + (": " + "; ".join(how) if how else "")
        )
    if median_bytes is not None and median_bytes < (4 << 20) and per_step_calls > 4:
        fixes.append(
            f"{per_step_calls:.0f} collectives per step of {median_bytes / 2**20:.1f} MiB median: fewer, larger ones "
            "(DDP bucket_cap_mb above its 25 MiB default; coalesce small tensors)"
        )
    if busbw is not None and link is not None and busbw < 0.5 * link["gbps_per_direction"]:
        fixes.append(
            f"bus bandwidth {busbw:.0f} GB/s is {pct(busbw, link['gbps_per_direction']):.0f}% of the {link['link']} "
            f"figure ({link['gbps_per_direction']:.0f} GB/s per direction): check the topology (nvidia-smi topo -m: the "
            "GPUs should be NV# apart, not PHB/SYS), that P2P is not disabled (NCCL_P2P_DISABLE), and NCCL_DEBUG=INFO's "
            "chosen transport"
        )
    if "allreduce" in kinds and any(d in ("Float", "Double") for d in dtypes):
        fixes.append(
            "gradients travel as fp32: a bf16 compression hook halves the bytes "
            "(model.register_comm_hook(None, default_hooks.bf16_compress_hook)), or train in bf16 end to end; "
            "the hook casts every bucket on the GPU both ways, which costs compute: worth it where the exposed "
            "transfer exceeds those casts (compare the step at 1 GPU with and without it)"
        )
    if "allgather" in kinds or "reducescatter" in kinds:
        fixes.append("FSDP: prefetch the next all-gather (forward_prefetch, backward_prefetch) and raise limit_all_gathers' window")
    if "allreduce" in kinds:
        fixes.append("DDP: gradient_as_bucket_view=True saves a copy of every bucket per step")
    if starved_ms * 1e6 >= 0.5 * max(gain_ns, 1) and pct(starved_ms * 1e6, wall) >= WARNING_PCT:
        fixes.insert(
            0,
            f"{starved_ms:.1f} ms of the exposed transfer (median rank) ran while a rank's GPU had no compute queued: "
            "its host was behind, which the profiler's own cost makes worse, so whether it holds the job back "
            f"unprofiled is not known from this trace (between {ms(gain_ns, 1)} and {upper_ms:.1f} ms of this window): "
            "compare the unprofiled step time at 1 and N GPUs (proflab run records it; proflab scaling)",
        )
    gain_pct = pct(gain_ns, wall, 2)
    # the replayed fix: gradients compressed to bf16 where they travel as fp32 (the casts at a
    # practical 80 % of the device's memory bandwidth)
    peaks = datasheet_peaks(device)
    compress = {}
    if "allreduce" in kinds and any(d in ("Float", "Double") for d in dtypes) and peaks is not None:
        compress = {None: [Fix("compress_comm", factor=0.5, rate_gbps=0.8 * peaks.hbm_gbps, label="bf16 compression hook")]}
    return [
        (with_try if compress else lambda f, *k: f)(_job_predicted(gain_finding(
            "communication_bound",
            gain_ns,
            wall,
            title=(
                f"Communication no compute hides: {blocking_ms:.3f} ms of transfer holds back compute that is queued "
                f"behind it on every rank ({pct(blocking_ms * 1e6, wall)}% of the window)"
            ),
            evidence=ev,
            fix="; ".join(fixes) + ".",
            where={"collectives": kinds, "ranks": rt["rank"].to_list()},
            assumption=(
                "the exposed transfer after every rank arrived (waiting for a late rank is load_imbalance's) with "
                "compute queued behind it on every rank (where a rank's GPU had nothing queued, its host was behind, "
                f"which the profiler's own cost makes worse: {starved_ms:.3f} ms on the median rank, not claimed), "
                "less each step's last collective, "
                "which has no compute left to hide behind; the job's time, counted once "
                f"({gain_pct}% of the median rank's window)"
            ),
        ), jw, compress), "ddp-bf16-hook", "ddp-bucket-mb=100", "ddp-grad-view")
    ]
