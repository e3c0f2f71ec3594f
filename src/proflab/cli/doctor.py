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
            "exit status: 0 when torch.profiler can profile a GPU program here (torch imports, is a CUDA build, sees a "
            "GPU, records CUDA activity through CUPTI, and the run folder is writable); 1 when it cannot; 2 on bad usage."
        ),
    )
    d.add_argument("--dir", default=None, metavar="DIR", help="the run folder to check (default proflab-runs)")
    d.add_argument("--python", default=None, metavar="PYTHON", help="the interpreter that runs your program (default: this one)")
    d.add_argument("--ncu-probe", action="store_true", help="also profile one tiny kernel with ncu: the definitive counter-permission test")
    d.add_argument("-f", "--format", choices=("term", "json"), default="term", help="output format (default term)")
    d.add_argument("-o", "--output", metavar="FILE", help="write here (atomically) instead of stdout")
    d.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from proflab.collect.doctor import doctor
    from proflab.collect.rundir import DEFAULT_ROOT
    from proflab.render.doctor import render_doctor

    rep = doctor(folder=args.dir or DEFAULT_ROOT, python=args.python, ncu_probe=args.ncu_probe)
    write_out(args, render_doctor(rep.to_dict(), args.format))
    return 0 if rep.can_profile else 1
