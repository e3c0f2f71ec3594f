"""The recording options: ``proflab run``'s, and ``proflab scaling --gpus``'s, which launches
``proflab run`` once per GPU count."""

from __future__ import annotations

import argparse


def recording_args(p) -> None:
    """What ``proflab run`` records and how it samples the GPU: run's options, and scaling's
    for the runs it launches."""
    g = p.add_argument_group("what is recorded")
    g.add_argument("--backend", choices=("torch", "nsys"), default="torch", help="torch.profiler (default) or Nsight Systems")
    g.add_argument("--window", choices=("auto", "steps", "time", "capture"), default="auto",
                   help="auto (default): steps, or a time window when no step comes; steps; time; "
                        "capture: inside proflab.capture() only")  # fmt: skip
    g.add_argument("--wait", type=int, default=3, metavar="N", help="steps skipped before recording (default 3)")
    g.add_argument("--warmup", type=int, default=1, metavar="N", help="profiler warm-up steps, discarded (default 1)")
    g.add_argument("--active", type=int, default=5, metavar="N", help="steps recorded (default 5)")
    g.add_argument("--delay", type=float, default=5.0, metavar="S",
                   help="time window: starts S s after torch is imported (auto: when no step came by then; default 5)")  # fmt: skip
    g.add_argument("--duration", type=float, default=10.0, metavar="S", help="time window length in s (default 10)")
    # The defaults of what is recorded live in one place, collect/defaults.py (RunOptions' too).
    from proflab.collect import defaults

    g.add_argument("--record-shapes", dest="record_shapes", action=argparse.BooleanOptionalAction,
                   default=defaults.RECORD_SHAPES,
                   help=f"record input shapes (default {'on' if defaults.RECORD_SHAPES else 'off'})")  # fmt: skip
    g.add_argument("--count-flops", dest="count_flops", action=argparse.BooleanOptionalAction,
                   default=defaults.COUNT_FLOPS,
                   help="count one unprofiled step's FLOPs with torch.utils.flop_counter, for MFU and TFLOPS/W "
                        f"(default {'on' if defaults.COUNT_FLOPS else 'off'})")  # fmt: skip
    g.add_argument("--with-stack", action=argparse.BooleanOptionalAction, default=defaults.WITH_STACK,
                   help="record Python stacks (links kernels to your lines)")  # fmt: skip
    g.add_argument("--profile-memory", action="store_true", help="record tensor allocations")
    g.add_argument("--memory-snapshot", action="store_true", help="write a CUDA memory snapshot (CUDA only)")
    g.add_argument("--capture-range", action="store_true",
                   help="record only inside proflab.capture() (nsys: cudaProfilerApi capture range)")  # fmt: skip
    g.add_argument("--capture", choices=("cuda-profiler-api",), default=None,
                   help="cuda-profiler-api: record inside the program's own cudaProfilerStart/Stop range, not steps or "
                        "time (torch.cuda.profiler.start()/stop() or torch.cuda.cudart().cudaProfilerStart() from "
                        "Python; TensorRT-LLM's TLLM_PROFILE_START_STOP); the first range with torch, as nsys does "
                        "with its cudaProfilerApi capture range; a C++ runtime's calls need --backend nsys")  # fmt: skip
    g.add_argument("--python-backtrace", action="store_true", help="nsys: Python backtraces of CUDA calls and Python sampling")
    g = p.add_argument_group("GPU monitor")
    g.add_argument("--no-monitor", dest="monitor", action="store_false", default=None, help="do not sample NVML")
    g.add_argument("--monitor-period", type=float, default=0.1, metavar="S", help="sampling period in s (default 0.1)")
    g = p.add_argument_group("the end")
    g.add_argument("--exit-timeout", type=float, default=60.0, metavar="S",
                   help="a process of the program still there S s after its main thread finished is hung at exit: "
                        "proflab says what it waited for, keeps what was recorded, ends it and exits 124 "
                        "(default 60; 0: wait for ever)")  # fmt: skip


def recording_options(args: argparse.Namespace) -> dict:
    """RunOptions' fields from ``recording_args``' options."""
    return dict(
        backend=args.backend, window=args.window, wait=args.wait, warmup=args.warmup, active=args.active,
        delay_s=args.delay, duration_s=args.duration, record_shapes=args.record_shapes, count_flops=args.count_flops,
        with_stack=args.with_stack,
        profile_memory=args.profile_memory, memory_snapshot=args.memory_snapshot, capture_range=args.capture_range,
        capture=args.capture,
        python_backtrace=args.python_backtrace, monitor=args.monitor, monitor_period_s=args.monitor_period,
        exit_timeout_s=args.exit_timeout,
    )  # fmt: skip


def recording_defaults() -> dict:
    p = argparse.ArgumentParser(add_help=False)
    recording_args(p)
    return recording_options(p.parse_args([]))
