"""``proflab doctor``: what this machine can profile, and why not."""

from __future__ import annotations

import argparse

from proflab.cli._common import write_out

__all__ = ["add_parsers", "cmd_doctor"]


def add_parsers(sub) -> None:
    d = sub.add_parser(
        "doctor",
        help="what this machine can profile, and why not: torch/CUDA/CUPTI, GPUs, NVML/GPM, ncu/nsys, counter permission",
        description=(
            "One line per check (ok / MISSING / WARNING, with the reason and the fix): Python, torch and its CUDA build, "
            "CUDA, CUPTI, NVML (driver), the GPUs, GPM, ncu and nsys with their versions, the GPU performance-counter "
            "permission (ERR_NVGPUCTRPERM), write access to the run folder and its free disk."
        ),
        epilog=(
            "Then what works here: trace analysis (anywhere), profiling CPU programs, profiling GPU programs, the GPU "
            "monitor, the kernel deep dive, the Nsight Systems backend, each with how to add it. "
            "exit status: 1 when something here does not work as it should (the run folder cannot be written, the "
            "interpreter given cannot run, a GPU is present but torch.profiler cannot profile it), or when --need names "
            "what this machine cannot do; else 0 (no GPU is not a failure); 2 on bad usage."
        ),
    )
    d.add_argument("--dir", default=None, metavar="DIR", help="the run folder to check (default proflab-runs)")
    d.add_argument("--python", default=None, metavar="PYTHON", help="the interpreter that runs your program (default: this one)")
    d.add_argument("--ncu-probe", action="store_true", help="also profile one tiny kernel with ncu: the definitive counter-permission test")
    d.add_argument("--need", choices=("analysis", "cpu", "gpu"), default=None,
                   help="exit 1 unless this works here: trace analysis, profiling CPU programs, or profiling GPU programs "
                        "(torch.profiler recording CUDA: the exit status of earlier releases)")
    d.add_argument("-f", "--format", choices=("term", "json"), default="term", help="output format (default term)")
    d.add_argument("-o", "--output", metavar="FILE", help="write here (atomically) instead of stdout")
    d.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from proflab.collect.doctor import doctor
    from proflab.collect.rundir import DEFAULT_ROOT
    from proflab.render.doctor import render_doctor

    rep = doctor(folder=args.dir or DEFAULT_ROOT, python=args.python, ncu_probe=args.ncu_probe)
    status = rep.exit_status(args.need)
    write_out(args, render_doctor(rep.to_dict(), args.format, need=args.need, status=status))
    return status
