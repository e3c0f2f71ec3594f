"""Conformance corpus: real traces from each PyTorch era and vendor we could obtain, each read
with its steps, kernels and device where the trace has them (tests/data/compat/README.md says
where each file comes from). Plus labelled synthetic cases for what the corpus cannot hold yet."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

import proflab
from proflab.cli import main
from shared_fixtures import FIXTURES

COMPAT = Path(__file__).parent / "data" / "compat"
KINETO = Path(__file__).parent / "data" / "kineto"


def _raw(path: Path) -> dict:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def _x(raw: dict, *cats: str) -> list[dict]:
    return [e for e in raw["traceEvents"] if e.get("ph") == "X" and e.get("cat") in cats]


def test_pytorch_1_8_trace_is_read_with_its_step_kernels_copies_and_devices():
    """Kineto's TensorBoard-plugin test trace (PyTorch 1.8 era, V100): categories Operator,
    Kernel, Memcpy, Runtime; 'computeProperties'; 'external id'; flows in cat 'async'; tids
    like "stream 7"; its ProfilerStep#2 span is an Operator."""
    path = COMPAT / "kineto_tb_plugin_gpu_metrics_input_torch1.8_v100.json.gz"
    raw = _raw(path)
    t = proflab.load(path)
    assert t.steps["step"].to_list() == [2]
    step = next(e for e in raw["traceEvents"] if e.get("name") == "ProfilerStep#2")
    assert t.steps["start_ns"][0] == step["ts"] * 1000 and t.steps["end_ns"][0] == (step["ts"] + step["dur"]) * 1000
    assert t.kernels.height == len(_x(raw, "Kernel")) == 30
    assert t.memcpy.height == len(_x(raw, "Memcpy")) == 2
    assert set(t.memcpy["copy_kind"].cast(pl.String)) == {"HtoD"} and t.memcpy["bytes"].to_list() == [640, 128]
    assert t.cpu.filter(pl.col("cat") == "cuda_runtime").height == len(_x(raw, "Runtime"))
    assert t.cpu.filter(pl.col("cat") == "cpu_op").height == len(_x(raw, "Operator"))
    # 'external id' (lower case) links kernels and runtime calls to their operator
    assert t.gpu["external_id"].null_count() == 0
    mm = t.kernels.filter(pl.col("name") == "volta_sgemm_128x32_nt")
    assert mm["external_id"].to_list() == [107, 160] and mm["stream"].to_list() == [7, 7] and mm["device"].to_list() == [0, 0]
    d = t.devices.row(0, named=True)
    assert t.devices.height == 4 and d["name"] == "Tesla V100-DGXS-32GB" and d["sm_count"] == 80 and d["compute_major"] == 7
    assert t.meta.notes == ()  # every category is known: nothing ignored, nothing coerced


def test_pytorch_1_8_trace_is_analysed_with_launches_per_step(capsys):
    path = COMPAT / "kineto_tb_plugin_gpu_metrics_input_torch1.8_v100.json.gz"
    rc = main(["analyze", str(path), "-f", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    r = json.loads(out)
    assert r["summary"]["step_count"] == 1
    assert r["launch"]["launch_calls"] == 30 and r["launch"]["launches_per_step"] == 30
    assert r["device"]["name"] == "Tesla V100-DGXS-32GB" and r["device"]["peak_source"] == "datasheet (V100)"


def test_hta_excerpt_from_2022_is_read():
    """An excerpt HTA keeps of a 2022 training trace (cpu_op / user_annotation / cuda_runtime,
    a backward thread): the step, the kernel with its launch geometry, its launch call."""
    path = COMPAT / "hta_call_stack_backward_thread_2022_a100.json.gz"
    raw = _raw(path)
    t = proflab.load(path)
    assert t.steps["step"].to_list() == [552]
    k = _x(raw, "kernel")[0]
    row = t.kernels.row(0, named=True)
    assert t.kernels.height == 1 and row["name"] == k["name"]
    assert (row["grid_x"], row["grid_y"], row["grid_z"]) == tuple(k["args"]["grid"])
    assert row["registers"] == 240 and row["shared_mem_bytes"] == 98304
    launch = t.cpu.filter(pl.col("cat") == "cuda_runtime")
    assert launch["name"].to_list() == ["cudaLaunchKernel"] and launch["correlation"].to_list() == [row["correlation"]]
    assert t.meta.distributed == {"rank": 0}
    assert t.devices.height == 0  # the excerpt keeps no deviceProperties


def test_current_pytorch_cpu_trace_is_read_and_says_what_it_holds(capsys):
    """Recorded here with the CPU build of the newest PyTorch we have (record_cpu.py)."""
    path = COMPAT / "torch2.13_cpu_mlp.pt.trace.json.gz"
    raw = _raw(path)
    t = proflab.load(path)
    steps = sorted(int(e["name"].split("#")[1]) for e in _x(raw, "user_annotation") if e["name"].startswith("ProfilerStep#"))
    assert t.steps["step"].to_list() == steps and len(steps) == 3
    assert t.gpu.height == 0
    assert t.cpu.filter(pl.col("cat") == "cpu_op").height == len(_x(raw, "cpu_op"))
    assert t.meta.notes[0].startswith("the trace holds host events only")
    rc = main(["analyze", str(path), "--width", "120"])
    out, _ = capsys.readouterr()
    assert rc == 0
    # said in the report's first lines (under the header), not among the closing notes
    assert out.splitlines()[1].startswith("the trace holds host events only"), out[:400]
    assert "note: the trace holds" not in out
    rc = main(["analyze", str(path), "-f", "md"])
    out, _ = capsys.readouterr()
    assert rc == 0 and out.splitlines()[2].startswith("> the trace holds host events only"), out[:400]


@pytest.mark.parametrize("version, ops, numbers", [("1.13.1", 360, [1, 2, 3]), ("2.0.1", 324, [1, 2, 3]), ("2.4.1", 324, [2, 3, 4])])
def test_older_pytorch_cpu_traces_are_read_with_their_steps(version, ops, numbers):
    """Recorded here with torch 1.13.1, 2.0.1 and 2.4.1 (record_cpu.py, each in a throwaway
    environment): ``deviceProperties`` is an empty list, steps are ``user_annotation`` spans
    (2.4 numbers the same schedule's steps from 2, and adds ``fwdbwd`` flows and
    ``baseTimeNanoseconds``)."""
    path = COMPAT / f"torch{version}_cpu_mlp.pt.trace.json.gz"
    raw = _raw(path)
    assert raw["deviceProperties"] == []
    t = proflab.load(path)
    steps = [e for e in _x(raw, "user_annotation") if e["name"].startswith("ProfilerStep#")]
    assert t.steps["step"].to_list() == numbers == sorted(int(e["name"].split("#")[1]) for e in steps)
    first = min(steps, key=lambda e: e["ts"])
    assert t.steps["start_ns"][0] == round(first["ts"] * 1000)
    assert t.gpu.height == 0 and t.devices.height == 0
    assert t.cpu.filter(pl.col("cat") == "cpu_op").height == len(_x(raw, "cpu_op")) == ops
    assert t.meta.notes[0].startswith("the trace holds host events only")


def test_real_mi300x_rocm7_trace_is_read_with_hip_launches_and_its_device(capsys):
    """A real MI300X trace (rocprofiler-sdk era, ROCm 7 HIP runtime) from TraceLens's
    evaluation set: ``hipLaunchKernel`` calls, ``[clone .kd]`` kernel names,
    ``hipDeviceSynchronize``, float timestamps with ``baseTimeNanoseconds``, eight
    ``AMD Instinct MI300X`` devices with 304 CUs. Its device has datasheet peaks."""
    path = COMPAT / "tracelens_mi300x_rocm7_elementwise_hiplaunchkernel.json.gz"
    raw = _raw(path)
    t = proflab.load(path)
    kernels = _x(raw, "kernel")
    assert t.kernels.height == len(kernels) == 10
    assert t.kernels["correlation"].to_list() == [k["args"]["correlation"] for k in kernels]
    assert set(t.kernels["name"]) == {kernels[0]["name"]} and kernels[0]["name"].endswith("[clone .kd]")
    launches = t.cpu.filter(pl.col("cat") == "cuda_runtime")
    assert launches.filter(pl.col("name") == "hipLaunchKernel").height == 10
    assert launches.filter(pl.col("name") == "hipDeviceSynchronize").height == 2
    assert t.devices.height == 8 and set(t.devices["name"]) == {"AMD Instinct MI300X"} and t.devices["sm_count"][0] == 304
    assert t.steps.height == 0  # recorded without prof.step()
    assert t.meta.notes == ()
    rc = main(["analyze", str(path), "-f", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    r = json.loads(out)
    assert r["launch"]["launch_calls"] == 10 and r["launch"]["kernels"] == 10
    assert r["device"]["name"] == "AMD Instinct MI300X" and r["device"]["peak_source"] == "datasheet (MI300X)"
    assert r["device"]["peak_hbm_gbps"] == 5300 and r["device"]["peak_bf16_tflops"] == 1307.4
    assert "datasheet peaks" not in {m["signal"] for m in r["missing"]}
    busy = sum(k["dur"] for k in kernels)  # one stream, no overlap: busy time is the kernels' sum
    assert r["summary"]["breakdown_ms"]["compute"] == pytest.approx(busy / 1000, abs=0.002)
    assert main(["analyze", str(path), "--width", "120"]) == 0
    assert "AMD Instinct MI300X (304 CUs)" in capsys.readouterr().out.splitlines()[0]


def test_real_mi300x_hip6_trace_links_kernels_to_launches_through_flows(capsys):
    """A real MI300X BF16 GEMM trace from TraceLens's evaluation set, of an earlier ROCm
    layout (HIP 6): ``hipExtModuleLaunchKernel`` with ``"stream": "0x0"`` (text), ``grid dim``/``block
    dim``, kernels that carry only an ``External id`` and no correlation or device, and no
    ``deviceProperties``. Kernels are tied to their launches through the ``ac2g`` flows."""
    path = COMPAT / "tracelens_mi300x_rocm_gemm_hipextmodulelaunchkernel.json.gz"
    raw = _raw(path)
    t = proflab.load(path)
    kernels = _x(raw, "kernel")
    assert t.kernels.height == len(kernels) == 20 and all("correlation" not in k["args"] for k in kernels)
    # the flow ending at each kernel carries the id of the flow starting at its launch call
    assert t.kernels["correlation"].to_list() == [k["args"]["External id"] for k in kernels]
    launch = t.cpu.filter(pl.col("name") == "hipExtModuleLaunchKernel")
    assert launch.height == 20 and set(launch["correlation"]) == set(t.kernels["correlation"])
    assert set(t.kernels["device"]) == {2}  # from the kernel's pid: the trace names no device
    assert t.devices.height == 0
    assert "args.stream: 20 values were strings, read as an integer" in t.meta.notes
    rc = main(["analyze", str(path), "-f", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    r = json.loads(out)
    assert r["launch"]["launch_calls"] == 20 and r["launch"]["median_launch_to_start_us"] is not None
    missing = {m["signal"] for m in r["missing"]}
    assert "device properties" in missing and "host launch calls" not in missing


def test_amd_peaks_only_for_a_whole_device():
    """Datasheet figures hold for the whole device: a partition (fewer CUs) or a die of a
    two-die MI250X gets none, and the report says why."""
    from proflab.analysis.devices import datasheet_peaks, peaks_missing_reason

    assert datasheet_peaks("AMD Instinct MI300X", 304).bf16_tflops == 1307.4
    assert datasheet_peaks("AMD Instinct MI300X", 38) is None
    assert "38 compute units, not the 304" in peaks_missing_reason("AMD Instinct MI300X", 38)
    assert datasheet_peaks("AMD Instinct MI250X / MI250", 104) is None
    assert datasheet_peaks("NVIDIA H100 80GB HBM3", 132).model == "H100 SXM"  # NVIDIA: no CU check


# Recorded on the H100 with PyTorch 2.11 (record_gpu.py): one bf16 MLP forward in each form a
# trace takes. name -> (step numbers, launch calls by name, kernel-name prefixes)
_H100 = {
    "compiled_max_autotune": (
        [0, 1, 2],
        {"cuLaunchKernel": 2, "cudaGraphLaunch": 3, "cudaLaunchKernel": 5},
        {"triton_tem_fused_gelu_mm_0", "triton_tem_fused_gelu_mm_1"},
    ),
    "compiled_no_cudagraphs": ([0, 1, 2], {"cuLaunchKernel": 6}, {"triton_tem_fused_gelu_mm_0", "triton_tem_fused_gelu_mm_1"}),
    "eager_cudagraph": ([1, 2, 3], {"cudaGraphLaunch": 3}, {"nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT"}),
}


@pytest.mark.parametrize("name", sorted(_H100))
def test_pytorch_2_11_h100_traces_read_with_steps_kernels_launches_and_device(name):
    """torch.compile(max-autotune) records a CUDA graph in its first profiled step (the Triton
    kernels launched through cuLaunchKernel while capturing) and replays it (cudaGraphLaunch);
    without CUDA graphs every Triton kernel comes from cuLaunchKernel; an eager forward captured
    into torch.cuda.CUDAGraph replays through cudaGraphLaunch. Each kernel is tied to the call
    that launched it, graph replays included."""
    numbers, launches, kernel_names = _H100[name]
    path = COMPAT / f"torch2.11_h100_{name}.pt.trace.json.gz"
    raw = _raw(path)
    t = proflab.load(path)
    assert t.steps["step"].to_list() == numbers
    assert t.kernels.height == len(_x(raw, "kernel")) and kernel_names <= set(t.kernels["name"])
    assert t.devices["name"][0] == "NVIDIA H100 80GB HBM3"
    calls = t.cpu.filter(pl.col("cat").is_in(["cuda_runtime", "cuda_driver"]))
    for call, n in launches.items():
        assert calls.filter(pl.col("name") == call).height == n, call
    # every kernel has a launch call with its correlation id
    assert set(t.kernels["correlation"]) <= set(calls["correlation"].drop_nulls())
    assert t.meta.notes == ()
    assert proflab.analyze(t).launch["launch_calls"] == sum(launches.values())


def test_export_chrome_trace_plain_json_is_read(tmp_path):
    """The eager forward written by prof.export_chrome_trace (plain JSON, kept gzip-compressed
    here): read from a plain .json file as written, cuLaunchKernelEx (cuBLAS's nvjet kernels)
    and cudaLaunchKernel both count; no schedule, so no ProfilerStep and the report says so."""
    plain = tmp_path / "trace.json"
    plain.write_bytes(gzip.decompress((COMPAT / "torch2.11_h100_eager_export_chrome_trace.json.gz").read_bytes()))
    raw = json.loads(plain.read_text())
    t = proflab.load(plain)
    assert t.kernels.height == len(_x(raw, "kernel")) == 9 and t.steps.height == 0
    calls = t.cpu.filter(pl.col("cat").is_in(["cuda_runtime", "cuda_driver"]))
    assert calls.filter(pl.col("name") == "cuLaunchKernelEx").height == 6
    assert set(t.kernels["correlation"]) <= set(calls["correlation"].drop_nulls())
    assert main(["analyze", str(plain), "-f", "json"]) == 0


def test_single_process_nccl_trace_keeps_its_collectives(capsys):
    """all_reduce and all_gather_into_tensor over a one-process NCCL group (world size 1, the
    only NCCL group one GPU allows): NCCL runs no kernel for one rank (the gather is a
    device-to-device copy, the all_reduce nothing), so the trace's collectives are the host's
    record_param_comms calls, which proflab keeps with their sizes."""
    path = COMPAT / "torch2.11_h100_nccl_world1.pt.trace.json.gz"
    raw = _raw(path)
    t = proflab.load(path)
    assert t.steps["step"].to_list() == [1, 2, 3] and t.kernels.height == 0
    assert t.comms["collective"].to_list() == ["allreduce", "_allgather_base"] * 3
    assert set(t.comms["in_nelems"]) == {1 << 20} and set(t.comms["group_size"]) == {1}
    copy = _x(raw, "gpu_memcpy")
    assert t.memcpy.height == len(copy) == 3 and set(t.memcpy["copy_kind"].cast(pl.String)) == {"DtoD"}
    assert t.memcpy["bytes"].to_list() == [4 << 20] * 3
    rc = main(["analyze", str(path), "-f", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err


@pytest.mark.parametrize("path", sorted(KINETO.glob("*.pt.trace.json.gz")), ids=lambda p: p.name.split(".")[0])
def test_recorded_pytorch_2_11_gpu_traces_read_without_coercion(path):
    """The GPU traces recorded for the rules (PyTorch 2.11, H100) decode on the strict path:
    no value needed coercing, so no note says so."""
    t = proflab.load(path)
    assert not [n for n in t.meta.notes if ": " in n and ("ignored" in n or "read as" in n or "dropped" in n)]
    if "cpu_only" not in path.name:
        assert t.kernels.height > 0 and t.steps.height > 0 and t.devices["name"][0] == "NVIDIA H100 80GB HBM3"


def test_nsys_chrome_export_is_read_as_the_array_of_events_it_is():
    """A Chrome-trace JSON derived from Nsight Systems (not Kineto), recorded elsewhere: it has
    its own categories; proflab says what it found instead of failing on a value's type."""
    path = FIXTURES / "kineto" / "t4_power_iteration_baseline_nsys_chrome.json"
    if not path.exists():
        pytest.skip("shared fixtures are not present (../shared/fixtures)")
    try:
        t = proflab.load(path)
    except proflab.errors.UnsupportedFormat as e:  # another tool's format: one clear line
        assert "categories found" in str(e) or "not a profiler trace" in str(e)
    else:
        assert t.meta.event_count > 0


# -- labelled synthetic cases: what no obtainable real file covers yet --------------------------


def _rocm_doc() -> dict:
    """SYNTHETIC: a ROCm-shaped Kineto trace (HIP runtime calls in cuda_runtime, an RCCL kernel,
    a copy named the ROCm way, stream handles as hex text). Shapes follow the MI250 ROCm 6.2
    trace the issue describes; values are invented."""
    host = {"ph": "X", "pid": 10, "tid": 10}
    gpu = {"ph": "X", "pid": 2, "tid": 1}
    ev = [
        {**host, "cat": "user_annotation", "name": "ProfilerStep#7", "ts": 100.0, "dur": 900.0, "args": {}},
        {**host, "cat": "cpu_op", "name": "aten::mm", "ts": 110.0, "dur": 40.0, "args": {"External id": 1}},
        {**host, "cat": "cuda_runtime", "name": "hipExtModuleLaunchKernel", "ts": 120.0, "dur": 5.0,
         "args": {"External id": 1, "correlation": 11, "stream": "0x7f3a2c0"}},
        {**gpu, "cat": "kernel", "name": "Cijk_Ailk_Bljk_BBS_BH_MT128x128x32", "ts": 130.0, "dur": 200.0,
         "args": {"External id": 1, "correlation": 11, "device": 2, "stream": 1, "grid": [256, 1, 1], "block": [256, 1, 1]}},
        {**host, "cat": "cuda_runtime", "name": "hipLaunchKernel", "ts": 340.0, "dur": 5.0, "args": {"correlation": 12}},
        {**gpu, "cat": "kernel", "name": "ncclDevKernel_Generic(ncclDevComm*, unsigned long, ncclWork*)", "ts": 350.0,
         "dur": 300.0, "args": {"correlation": 12, "device": 2, "stream": 2}},
        {**host, "cat": "cuda_runtime", "name": "hipMemcpyWithStream", "ts": 660.0, "dur": 200.0, "args": {"correlation": 13}},
        {**gpu, "cat": "gpu_memcpy", "name": "CopyDeviceToHost", "ts": 670.0, "dur": 20.0,
         "args": {"correlation": 13, "device": 2, "stream": 1, "bytes": 4096}},
        {**host, "cat": "cuda_runtime", "name": "hipLaunchKernel", "ts": 870.0, "dur": 5.0, "args": {"correlation": 14}},
        {**gpu, "cat": "kernel", "name": "elementwise_kernel", "ts": 880.0, "dur": 10.0,
         "args": {"correlation": 14, "device": 2, "stream": 1}},
        {**host, "cat": "cuda_runtime", "name": "hipDeviceSynchronize", "ts": 880.0, "dur": 15.0, "args": {"correlation": 15}},
    ]
    props = [{"id": 2, "name": "AMD Instinct MI250X / MI250", "totalGlobalMem": 68702699520, "computeMajor": 9,
              "computeMinor": 0, "numSms": 104, "maxThreadsPerMultiprocessor": 2048}]
    return {"schemaVersion": 1, "deviceProperties": props, "roctracer_version": 4, "traceEvents": ev}


def test_rocm_shaped_trace_gets_the_same_analysis(tmp_path, capsys):
    p = tmp_path / "rocm.json"
    p.write_text(json.dumps(_rocm_doc()))
    t = proflab.load(p)
    assert t.steps["step"].to_list() == [7]
    assert t.kernels["is_comm"].to_list() == [False, True, False]  # RCCL kernels keep NCCL's names
    assert t.memcpy["copy_kind"].cast(pl.String).to_list() == ["DtoH"]
    assert t.devices["name"].to_list() == ["AMD Instinct MI250X / MI250"]
    assert "args.stream: 1 value was a string, read as an integer" in t.meta.notes
    rc = main(["analyze", str(p), "-f", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    r = json.loads(out)
    assert r["launch"]["launch_calls"] == 3  # hipExtModuleLaunchKernel and hipLaunchKernel
    assert r["device"]["name"] == "AMD Instinct MI250X / MI250"
    assert r["summary"]["breakdown_ms"]["communication"] > 0
    missing = {m["signal"]: m for m in r["missing"]}
    assert "datasheet peaks" in missing, r["missing"]
    # the GPU idles from the copy's end (690 us) to the next kernel (880 us) while the host is
    # blocked in hipMemcpyWithStream until 860 us: a sync gap, found through the HIP name
    assert r["idle"]["gaps_by_cause"]["sync"] == 1 and r["idle"]["by_cause_ms"]["sync"] == pytest.approx(0.19)
    assert any("hipMemcpyWithStream" in f["title"] for f in r["findings"]), [f["title"] for f in r["findings"]]


def test_other_accelerator_trace_says_what_it_holds(tmp_path):
    """SYNTHETIC: host events plus activity in MTIA's categories, which proflab does not diagnose."""
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0.0, "dur": 50.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 10.0},
        {"ph": "X", "cat": "mtia_ccp_events", "name": "kernel_a", "pid": 5, "tid": 1, "ts": 2.0, "dur": 10.0},
        {"ph": "X", "cat": "mtia_runtime", "name": "launch", "pid": 1, "tid": 1, "ts": 1.5, "dur": 1.0},
    ]
    p = tmp_path / "mtia.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    t = proflab.load(p)
    assert t.meta.notes[0].startswith("the trace holds host events and activity of MTIA")
    assert t.steps.height == 1 and t.gpu.height == 0


@pytest.mark.parametrize("form", ["array", "object"])
def test_chrome_array_form_and_step_in_gpu_user_annotation(tmp_path, form, capsys):
    """SYNTHETIC: the Chrome 'JSON array' form, and a trace whose only ProfilerStep spans are
    the GPU-side copies (gpu_user_annotation): they are the steps then."""
    ev = [
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#3", "pid": 0, "tid": 7, "ts": 10.0, "dur": 30.0},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 12.0, "dur": 5.0, "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": 1, "tid": 1, "ts": 11.0, "dur": 1.0, "args": {}},
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(ev if form == "array" else {"displayTimeUnit": "ns", "baseTimeNanoseconds": "17", "traceEvents": ev}))
    t = proflab.load(p)
    assert t.steps.rows() == [(3, 10_000, 40_000)]
    assert t.kernels.height == 1
    assert t.cpu.filter(pl.col("cat") == "cuda_driver")["name"].to_list() == ["cuLaunchKernel"]
    assert main(["analyze", str(p), "-f", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["launch"]["launch_calls"] == 1 and r["summary"]["step_count"] == 1  # a driver launch counts
    if form == "object":
        assert t.meta.base_time_ns == 17  # numeric text, read as a number, and said so
        assert "baseTimeNanoseconds: 1 value was a string, read as an integer" in t.meta.notes


def test_flows_fill_only_missing_correlation_ids(tmp_path):
    """SYNTHETIC: a kernel with its own correlation id keeps it when a flow says otherwise; one
    without gets the id of the flow ending on it, and its launch the id of the flow starting on
    it. A flow whose id is not an integer links nothing."""
    host, gpu = {"pid": 1, "tid": 1}, {"pid": 0, "tid": 7}
    ev = [
        {"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", **host, "ts": 10, "dur": 2, "args": {}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 5, **host, "ts": 10},
        {"ph": "X", "cat": "kernel", "name": "a", **gpu, "ts": 20, "dur": 5, "args": {}},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 5, "bp": "e", **gpu, "ts": 20},
        {"ph": "X", "cat": "kernel", "name": "b", **gpu, "ts": 30, "dur": 5, "args": {"correlation": 9}},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 6, "bp": "e", **gpu, "ts": 30},
        {"ph": "X", "cat": "kernel", "name": "c", **gpu, "ts": 40, "dur": 5, "args": {}},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 1.5, "bp": "e", **gpu, "ts": 40},
    ]
    p = tmp_path / "flows.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    t = proflab.load(p)
    assert t.kernels["correlation"].to_list() == [5, 9, None]
    assert t.cpu.filter(pl.col("name") == "hipLaunchKernel")["correlation"].to_list() == [5]
