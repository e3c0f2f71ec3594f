"""Nsight Compute input: real ncu 2025.3 outputs of kernels with one planted property each
(tests/data/record/ncu_workloads.py, recorded on an H100 by record_ncu.py), a real training
step (train_step.py) with its timeline, and the shared T4 details-page fixture."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from proflab.analysis.deepdive.verdicts import base_function_name, verdicts
from proflab.cli import main
from proflab.report.deepdive import deep_dive
from proflab.errors import EmptyTrace, SchemaError, UnsupportedFormat
from proflab.readers import ncu
from proflab.readers.ncu import load as load_ncu

DATA = Path(__file__).parent / "data" / "ncu"
FIXTURE = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "ncu" / "copy_blocked_details.csv"
FULL = [DATA / "workloads_full_raw.csv.gz", DATA / "workloads_full_details.csv.gz"]
TARGETED = [DATA / "workloads_targeted_raw.csv.gz", DATA / "workloads_targeted_details.csv.gz"]


@pytest.fixture(scope="module", params=["full", "targeted"])
def by_name(request):
    prof = load_ncu(FULL if request.param == "full" else TARGETED)
    return {v.name: v for v in verdicts(prof)}


@pytest.mark.parametrize(("text", "value"), [("4,963,609,951.19", 4963609951.19), ("61.84", 61.84), ("1,024", 1024.0),
                                             ("1.2e+03", 1200.0), ("n/a", None), ("(256, 1, 1)", None), ("", None)])
def test_values_with_thousands_separators(text, value):
    assert ncu.parse_value(text) == value


@pytest.mark.parametrize(("unit", "base", "factor"), [
    ("msecond", "ns", 1e6), ("usecond", "ns", 1e3), ("ms", "ns", 1e6), ("Gbyte/s", "byte/s", 1e9), ("Kbyte/block", "byte/block", 1e3),
    ("Ghz", "hz", 1e9), ("sector/ns", "sector/s", 1e9), ("%", "%", 1.0), ("Kbyte/cycle", "byte/cycle", 1e3), ("inst", "inst", 1.0)])
def test_units_become_base_units(unit, base, factor):
    assert ncu.base_unit(unit) == (base, factor)


def test_raw_and_details_pages_read_with_units_normalised():
    raw = ncu.read(FULL[0])
    assert raw.kind == "raw" and raw.launches.height == 10
    # pf_stream_triad: ncu printed "0.286752" msecond and "1.024" Kbyte/block
    assert raw.value(0, "gpu__time_duration.sum") == pytest.approx(286752.0)
    assert raw.value(3, "launch__shared_mem_per_block_dynamic") == pytest.approx(163840.0)
    det = ncu.read(FULL[1])
    assert det.kind == "details" and det.rules.height > 0
    # the details page's display names map to the raw page's metric names
    assert det.value(0, "gpu__time_duration.sum") == pytest.approx(raw.value(0, "gpu__time_duration.sum"), rel=1e-3)
    assert det.value(0, "sm__throughput.avg.pct_of_peak_sustained_elapsed") == pytest.approx(
        raw.value(0, "sm__throughput.avg.pct_of_peak_sustained_elapsed"), abs=0.01)


def test_stdout_capture_with_prof_lines_and_program_output():
    text = gzip.decompress((DATA / "workloads_targeted_stdout.csv.gz").read_bytes()).decode()
    assert text.startswith("==WARNING==") and "ran 10 kernels" in text
    prof = ncu.parse_csv_text(text, "stdout.csv")
    assert prof.launches["name"].to_list()[:2] == ["pf_stream_triad", "pf_tiny"]


def test_planted_bound_classes(by_name):
    assert by_name["pf_stream_triad"].bound == "memory" and by_name["pf_stream_triad"].memory_unit == "DRAM"
    assert by_name["pf_fma_heavy"].bound == "compute"
    assert by_name["pf_tiny"].bound == "latency"
    gemm = next(v for n, v in by_name.items() if n.startswith("nvjet"))
    assert gemm.bound == "compute" and gemm.metrics["tensor_pipe_pct"] > 90
    sgemm = next(v for n, v in by_name.items() if "xmma_gemm_f32f32" in n)
    assert sgemm.metrics["tensor_pipe_pct"] < 1


def test_planted_occupancy_limiters(by_name):
    smem = by_name["pf_smem_limited"]
    assert smem.occupancy_limiter == "shared memory" and smem.metrics["theoretical_occupancy_pct"] == pytest.approx(6.25)
    regs = by_name["pf_regs_heavy"]
    assert regs.occupancy_limiter == "registers" and regs.metrics["theoretical_occupancy_pct"] < 50


def test_planted_access_patterns(by_name):
    assert by_name["pf_strided"].uncoalesced["load_sectors_per_request"] == pytest.approx(32.0)
    assert by_name["pf_stream_triad"].uncoalesced["load_sectors_per_request"] == pytest.approx(4.0)
    assert by_name["pf_bank_conflict"].bank_conflicts["excessive_wavefronts_pct"] > 90
    assert by_name["pf_stream_triad"].bank_conflicts["excessive_wavefronts_pct"] == 0
    assert by_name["pf_divergent"].metrics["active_threads_per_warp"] == pytest.approx(16.0, abs=0.1)
    assert by_name["pf_fma_heavy"].metrics["active_threads_per_warp"] == pytest.approx(32.0)
    assert by_name["pf_bank_conflict"].stalls[0]["reason"] in ("mio_throttle", "short_scoreboard")
    assert by_name["pf_strided"].stalls[0]["reason"] == "long_scoreboard"


def test_findings_name_each_planted_cause():
    prof = load_ncu(FULL)
    report = deep_dive(prof)
    cats = {(f.category, f.where["kernels"][0]) for f in report.findings}
    for expected in [("bank_conflicts", "pf_bank_conflict"), ("uncoalesced_access", "pf_strided"),
                     ("low_occupancy", "pf_smem_limited"), ("divergence", "pf_divergent"),
                     ("memory_bound", "pf_stream_triad"), ("latency_bound", "pf_tiny"), ("compute_bound", "pf_fma_heavy")]:
        assert expected in cats, expected
    # no cause is claimed where it was not planted
    assert ("uncoalesced_access", "pf_stream_triad") not in cats
    assert ("bank_conflicts", "pf_strided") not in cats
    assert ("divergence", "pf_fma_heavy") not in cats
    gains = [f.est_gain_ms for f in report.findings]
    assert gains == sorted(gains, reverse=True)
    top = report.findings[0]
    assert top.category == "bank_conflicts" and top.evidence["est_speedup_pct"] == pytest.approx(96.86, abs=0.05)
    assert "ncu's SharedMemoryConflicts" in top.assumption


def test_roofline_of_the_triad_matches_hand_arithmetic():
    prof = load_ncu(FULL)
    v = {v.name: v for v in verdicts(prof)}["pf_stream_triad"]
    r = v.roofline
    n = 1 << 26  # one FFMA (2 FLOP) per element
    assert r.flop["fp32"] == pytest.approx(2 * n, rel=0.01)
    # reads b and c, writes a: 3 x 256 MiB at DRAM
    assert r.bytes["dram"] == pytest.approx(3 * 4 * n, rel=0.02)
    assert r.bound_by == "memory"
    achieved_bw = r.bytes["dram"] / (r.duration_ns * 1e-9)
    assert r.percent_of_roof == pytest.approx(100 * achieved_bw / r.peak_bandwidth["dram"], rel=1e-6)
    assert r.peak_bandwidth["dram"] == pytest.approx(3.35e12, rel=0.01)  # H100 SXM HBM3


def test_targeted_sections_give_the_roofline_too():
    v = {v.name: v for v in verdicts(load_ncu(TARGETED))}
    assert not v["pf_stream_triad"].roofline.missing
    assert v["pf_fma_heavy"].roofline.percent_of_roof > 90


def test_t4_details_fixture():
    if not FIXTURE.exists():
        pytest.skip("shared fixtures folder absent")
    prof = ncu.read(FIXTURE)
    (v,) = verdicts(prof)
    assert v.bound == "memory" and v.metrics["duration_ns"] == pytest.approx(21058944)
    report = deep_dive(prof)
    unc = [f for f in report.findings if f.category == "uncoalesced_access"]
    assert unc and unc[0].evidence["est_speedup_pct"] == pytest.approx(74.14, abs=0.05)
    assert "warp stall reasons" in v.missing  # the details page has no stall breakdown


def test_joined_to_the_timeline():
    from proflab.api import load

    trace = load(DATA / "train_step.pt.trace.json.gz")
    prof = load_ncu([DATA / "train_step_raw.csv.gz", DATA / "train_step_details.csv.gz"])
    report = deep_dive(prof, trace)
    d = report.to_dict()
    assert d["kernel_verdicts"]
    kf = [f for f in report.findings if f.category in ("memory_bound", "compute_bound", "latency_bound")]
    assert kf and all(f.evidence["kernel_time_from"] == "timeline" for f in kf)
    # a kernel's gain is a share of the trace window, like the timeline findings
    f = kf[0]
    assert f.est_gain_pct == pytest.approx(100 * f.est_gain_ms / d["summary"]["wall_ms"], abs=0.01)
    assert any("ncu" in k for k in d["kernels"])


def test_base_function_name():
    assert base_function_name("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
                              "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)") \
        == "vectorized_elementwise_kernel"
    assert base_function_name("pf_tiny") == "pf_tiny"
    assert base_function_name("copy_blocked[v1,abc](Array<long long, 1, C>, long long)") == "copy_blocked[v1,abc]"


def test_cli_import_json_valid_against_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    out = tmp_path / "k.json"
    chart = tmp_path / "roof.svg"
    assert main(["kernels", "--import", *map(str, FULL), "-o", str(out), "--roofline", str(chart)]) == 0
    d = json.loads(out.read_text())
    schema = json.loads((Path(__file__).parents[1] / "src" / "proflab" / "schema" / "report.schema.json").read_text())
    jsonschema.validate(d, schema)
    assert len(d["kernel_verdicts"]) == 10
    assert chart.read_text().lstrip().startswith("<?xml")


def test_roofline_svg_escapes_kernel_names(tmp_path):
    from proflab.render.roofline import write_roofline

    prof = load_ncu(FULL)
    vs = [v.to_dict() for v in verdicts(prof)]
    vs[0]["name"] = '<script>alert("x")</script>&'
    out = tmp_path / "r.svg"
    write_roofline(vs, out)
    svg = out.read_text()
    assert "<script>" not in svg


def test_terminal_output_has_the_deep_dive(capsys):
    assert main(["kernels", "--import", str(FULL[0]), "--width", "80"]) == 0
    out = capsys.readouterr().out
    assert "Kernel deep dive (Nsight Compute)" in out and "pf_bank_conflict" in out
    assert "missing: ncu rule results" in out


def test_bad_inputs_one_line_exit_2(tmp_path, capsys):
    raw = gzip.decompress(FULL[0].read_bytes()).decode()
    cases = {
        "truncated.csv": raw[: len(raw) // 2],
        "notncu.csv": "a,b,c\n1,2,3\n",
        "empty.csv": "",
        "header_only.csv": raw.splitlines()[0] + "\n" + raw.splitlines()[1] + "\n",
    }
    for name, text in cases.items():
        p = tmp_path / name
        p.write_text(text)
        rc = main(["kernels", "--import", str(p)])
        err = capsys.readouterr().err
        assert rc == 2, name
        assert err.count("\n") == 1 and str(p) in err, err
    (tmp_path / "bad.gz").write_bytes(FULL[0].read_bytes()[:2000])
    assert main(["kernels", "--import", str(tmp_path / "bad.gz")]) == 2


def test_reader_errors_are_typed(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("hello\n")
    with pytest.raises(UnsupportedFormat):
        ncu.read(p)
    raw = gzip.decompress(FULL[0].read_bytes()).decode().splitlines()
    p.write_text("\n".join(raw[:2]) + "\n")
    with pytest.raises(EmptyTrace):
        ncu.read(p)
    p.write_text("\n".join(raw[:3])[:-200] + "\n")
    with pytest.raises(SchemaError):
        ncu.read(p)


def test_collect_plan_and_argv_from_a_real_trace(tmp_path):
    from proflab.api import load
    from proflab.collect import ncu as c

    trace = load(DATA / "train_step.pt.trace.json.gz")
    plan = c.plan_from_trace(trace, top=3)
    assert len(plan.functions) <= 3 and plan.launch_count <= c.MAX_LAUNCHES and plan.launch_skip > 0
    argv = c.build_argv("ncu", plan, ["python", "train.py", "--x;rm -rf /"], tmp_path / "report")
    assert argv[:3] == ["ncu", "--clock-control", "none"]
    assert argv[-3:] == ["python", "train.py", "--x;rm -rf /"]  # passed as one argv item, never a shell string
    assert "--set" not in argv and argv.count("--section") == len(c.DEFAULT_SECTIONS)
    full = c.build_argv("ncu", plan, ["python"], tmp_path / "r", full=True, replay_mode="application")
    assert full[full.index("--set") + 1] == "full" and full[full.index("--replay-mode") + 1] == "application"
    with pytest.raises(c.NoKernelsProfiled, match="hottest kernels are"):
        c.plan_from_trace(trace, kernel_regex="no_such_kernel")


def test_kernels_without_ncu_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH holding no ncu: the real situation on CI
    rc = main(["kernels", str(DATA / "train_step.pt.trace.json.gz"), "--", "python", "train.py"])
    assert rc == 2
    assert "ncu is not on the PATH" in capsys.readouterr().err


def test_analyze_run_directory_with_ncu_results_shows_both_levels(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "ncu").mkdir(parents=True)
    (run / "train_step.pt.trace.json.gz").write_bytes((DATA / "train_step.pt.trace.json.gz").read_bytes())
    for page in ("raw", "details"):
        (run / "ncu" / f"{page}.csv").write_bytes(gzip.decompress((DATA / f"train_step_{page}.csv.gz").read_bytes()))
    assert main(["analyze", str(run), "--width", "80"]) == 0
    out = capsys.readouterr().out
    assert "GPU busy" in out and "Kernel deep dive (Nsight Compute)" in out


def test_analyze_a_proflab_run_directory_reads_its_traces_folder(capsys):
    run = Path(__file__).parent / "data" / "runs" / "20261122-074634-h100_cuda_train"
    # the run directory also holds analysis.json and meta.json, which are not traces
    assert main(["analyze", str(run), "--width", "80"]) == 0
    assert "GPU busy" in capsys.readouterr().out


def test_stalls_fall_back_to_pc_sampling_counts():
    # a raw page with SourceCounters but no WarpStateStats: stall reasons come from PC samples
    text = ('"ID","Process ID","Process Name","Host Name","Kernel Name","gpu__time_duration.sum",'
            '"smsp__pcsamp_warps_issue_stalled_long_scoreboard","smsp__pcsamp_warps_issue_stalled_wait",'
            '"smsp__pcsamp_warps_issue_stalled_selected"\n'
            '"","","","","","nsecond","","",""\n'
            '"0","1","python","h","k","1,000","300","100","600"\n')
    (v,) = verdicts(ncu.parse_csv_text(text, "pcsamp.csv"))
    assert [(s["reason"], s["samples"], s["share_pct"]) for s in v.stalls] == [("long_scoreboard", 300, 75.0), ("wait", 100, 25.0)]


# --- local memory (pf_spill: a 256-float per-thread array indexed at run time) ---------------

SPILL_FULL = [DATA / "spill_full_raw.csv.gz", DATA / "spill_full_details.csv.gz"]
SPILL_TARGETED = [DATA / "spill_targeted_raw.csv.gz", DATA / "spill_targeted_details.csv.gz"]


@pytest.mark.parametrize("pages", [SPILL_FULL, SPILL_TARGETED, SPILL_TARGETED[:1]], ids=["full", "targeted", "targeted-raw"])
def test_spill_verdict_names_local_memory(pages):
    prof = load_ncu(pages)
    (v,) = verdicts(prof)
    lm = v.local_memory
    # hand arithmetic from the raw page: local sectors over local + global sectors
    lid = prof.launch_ids[0]
    local = sum(prof.value(lid, f"l1tex__t_sectors_pipe_lsu_mem_local_op_{op}.sum") for op in ("ld", "st"))
    glob = sum(prof.value(lid, f"l1tex__t_sectors_pipe_lsu_mem_global_op_{op}.sum") or 0 for op in ("ld", "st", "atom", "red"))
    assert lm["share_of_l1_sectors_pct"] == pytest.approx(100 * local / (local + glob), abs=0.01)
    assert lm["share_of_l1_sectors_pct"] > 95 and lm["local_bytes"] == int(local * 32)
    # not a register spill: ncu counts no spill requests; the array sits in a 1 KiB stack frame
    assert lm["kind"] == "local arrays" and lm["spill_requests"] == 0
    assert lm["registers_per_thread"] == 32 and lm["stack_bytes_per_thread"] == 1024
    assert "local memory 99% of L1 sectors" in v.headline
    report = deep_dive(prof)
    top = report.findings[0]
    assert top.id == "local_memory_spills:pf_spill" and top.category == "memory_bound"
    assert "per-thread arrays in local memory" in top.title and "registers cannot be indexed at run time" in top.fix
    assert top.evidence["share_of_l1_sectors_pct"] > 95
    by_cat = {f.category: f for f in report.findings[1:]}
    # ranked ahead of the generic readings it explains, and the L1TEX stall is not a second finding
    assert top.est_gain_ms >= by_cat["latency_bound"].est_gain_ms
    assert "local memory" in by_cat["latency_bound"].fix
    assert "warp_stalls" not in by_cat
    if "uncoalesced_access" in by_cat:  # global accesses are 1% of L1 sectors: so is what fixing them saves
        assert by_cat["uncoalesced_access"].evidence["est_speedup_pct"] <= 100 - lm["share_of_l1_sectors_pct"] + 0.05


def test_spill_from_the_details_page_alone():
    prof = load_ncu(SPILL_FULL[1:])
    (v,) = verdicts(prof)
    # no sector counts: local memory is known from ncu's access-pattern rules on local loads/stores
    assert v.local_memory["share_of_l1_sectors_pct"] is None
    assert {r["est_speedup_pct"] for r in v.local_memory["ncu_rules"]} == {28.44, 26.32}
    report = deep_dive(prof)
    top = report.findings[0]
    assert top.id == "local_memory_spills:pf_spill"
    lat = next(f for f in report.findings if f.category == "latency_bound")
    assert top.est_gain_ms >= lat.est_gain_ms
    # the local-load rule no longer poses as uncoalesced global access: ncu's global rule is used
    unc = next(f for f in report.findings if f.category == "uncoalesced_access")
    assert unc.evidence["est_speedup_pct"] == pytest.approx(17.9, abs=0.05) and "UncoalescedGlobalAccess" in unc.assumption


def test_spill_cli_verdict_line_and_schema(tmp_path, capsys):
    jsonschema = pytest.importorskip("jsonschema")
    assert main(["kernels", "--import", *map(str, SPILL_TARGETED), "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "Verdict: memory_bound (local_memory_spills) — fixing it saves " in out and "over the window" in out and "predicted)" in out
    assert "local memory: local arrays, 99.06% of L1 sectors, 0 spill requests, 32 registers/thread, 1,024 B stack/thread" in out
    path = tmp_path / "k.json"
    assert main(["kernels", "--import", *map(str, SPILL_TARGETED), "-o", str(path)]) == 0
    schema = json.loads((Path(__file__).parents[1] / "src" / "proflab" / "schema" / "report.schema.json").read_text())
    d = json.loads(path.read_text())
    jsonschema.validate(d, schema)
    assert d["kernel_verdicts"][0]["local_memory"]["kind"] == "local arrays"


def test_no_local_memory_where_none_was_planted():
    prof = load_ncu(FULL)
    assert all(v.local_memory is None and "local memory traffic" not in v.missing for v in verdicts(prof))
    assert not [f for f in deep_dive(prof).findings if f.id.startswith("local_memory_spills:")]


def test_targeted_sections_collect_the_local_memory_metrics():
    # spill_targeted_* was recorded with proflab.collect.ncu.DEFAULT_SECTIONS: what
    # `proflab kernels` collects carries every local-memory metric the verdict reads
    from proflab.analysis.deepdive.verdicts import _LOCAL_METRICS

    raw = ncu.read(DATA / "spill_targeted_raw.csv.gz")
    names = raw.metric_names(raw.launch_ids[0])
    for key, alternatives in _LOCAL_METRICS.items():
        assert any(n in names for n in alternatives), key


def test_register_spills_get_the_register_pressure_fix():
    # a raw page with ncu's spill counters set (no real spilling kernel is recorded): the same
    # columns and units as the real captures
    cols = {"gpu__time_duration.sum": ("nsecond", "1,000"), "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "5"),
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": ("%", "40"),
            "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum": ("sector", "600"),
            "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum": ("sector", "200"),
            "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": ("sector", "200"),
            "derived__local_spilling_requests": ("", "50"), "sass__inst_executed_register_spilling": ("inst", "400"),
            "launch__registers_per_thread": ("register/thread", "255"),
            "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": ("inst", "9"),
            "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": ("inst", "1")}
    head = '"ID","Process ID","Process Name","Host Name","Kernel Name",' + ",".join(f'"{c}"' for c in cols)
    units = '"","","","","",' + ",".join(f'"{u}"' for u, _ in cols.values())
    row = '"0","1","python","h","k",' + ",".join(f'"{x}"' for _, x in cols.values())
    (v,) = verdicts(ncu.parse_csv_text("\n".join([head, units, row]) + "\n", "spills.csv"))
    assert v.local_memory["kind"] == "register spills" and v.local_memory["share_of_l1_sectors_pct"] == 80.0
    report = deep_dive(ncu.parse_csv_text("\n".join([head, units, row]) + "\n", "spills.csv"))
    top = report.findings[0]
    assert top.id == "local_memory_spills:k" and "register spills to local memory" in top.title
    assert "__launch_bounds__" in top.fix and "-maxrregcount" in top.fix
    # 80% of L1 sectors times 90% of stall cycles on long_scoreboard
    assert top.evidence["est_speedup_pct"] == pytest.approx(72.0)


# --- a verdict from the details page alone ---------------------------------------------------


def test_details_only_gemm_reads_the_tensor_pipe_from_ncu_rules():
    (gemm,) = [v for v in verdicts(ncu.read(FULL[1])) if v.name.startswith("nvjet")]
    # the details page shows L1 at 98% and SM at 93%; its tensor pipe is only in the rule text
    assert gemm.metrics["l1_pct"] > 95 and gemm.metrics["tensor_pipe_pct"] == pytest.approx(93.2)
    assert gemm.bound == "compute" and "tensor cores" in gemm.headline
    assert "HighPipeUtilization" in gemm.metric_sources["tensor_pipe_pct"]
    fp32 = next(v for v in verdicts(ncu.read(FULL[1])) if "xmma_gemm_f32f32" in v.name)
    assert fp32.top_pipe["pipe"] == "FMA" and fp32.metrics["tensor_pipe_pct"] is None


def test_details_only_without_pipe_rules_says_the_tensor_pipe_is_unknown(tmp_path):
    # the real details page with ncu's HighPipeUtilization rows taken out, as a details page
    # exported without the ComputeWorkloadAnalysis section reads
    lines = gzip.decompress(FULL[1].read_bytes()).decode().splitlines()
    p = tmp_path / "no_pipes_details.csv"
    p.write_text("\n".join(ln for ln in lines if '"HighPipeUtilization"' not in ln) + "\n")
    vs = {v.name: v for v in verdicts(ncu.read(p))}
    gemm = next(v for n, v in vs.items() if n.startswith("nvjet"))
    assert gemm.bound is None and "tensor pipe utilisation unknown" in gemm.bound_note
    assert "tensor_pipe_pct" in gemm.missing
    report = deep_dive(ncu.read(p))
    assert not [f for f in report.findings if f.category == "memory_bound" and f.where["kernels"][0] == gemm.name]
    # kernels that are memory-bound stay so
    assert vs["pf_bank_conflict"].bound == "memory" and vs["pf_stream_triad"].bound == "memory"


def test_the_deep_dive_lives_in_the_layers():
    with pytest.raises(ModuleNotFoundError):
        __import__("proflab.deepdive")
    from proflab.errors import UsageError

    with pytest.raises(UsageError):
        load_ncu([])
    with pytest.raises(UsageError):
        load_ncu([FULL[0], TARGETED[0]])  # two raw pages
