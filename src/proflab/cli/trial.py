"""``proflab try``: make a fix without code changes and measure what it saves."""

from __future__ import annotations

import argparse
import json


__all__ = ["add_parsers", "cmd_try"]


def add_parsers(sub) -> None:
    from proflab.collect.knobs import KNOBS

    knobs = "\n".join(f"  {k}{'=' + v[0].split('|')[0] if v[0] else ''}: {v[1]}" for k, v in KNOBS.items())
    t = sub.add_parser(
        "try",
        help="measure a fix without code changes: proflab try tf32 -- python train.py",
        description=(
            "Run the program bare as it is and with the fix, interleaved, timing its unprofiled steps (on the GPU's "
            "clock, as run does), until the 95% interval of the saving is narrow enough; print the measured saving "
            "with its interval beside the predicted one (from a profiled run of the program as it is, or --from). "
            "Verdict: faster, slower, no clear change, or inconclusive, with the reason: the runs fall into two "
            "groups (a bimodal machine or program; the trial then stops at --rounds), or the interval spans no "
            "change and is still wider than --target after --max-rounds."
        ),
        epilog=f"fixes:\n{knobs}\n  nccl:NAME=VALUE, env:NAME=VALUE: set in the environment\n\n"
               "example: proflab try workers=4 pin-memory -- python train.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    t.add_argument("fixes", nargs="*", metavar="FIX", help="the fix(es) to make together (see below)")
    t.add_argument("-o", "--out", default="proflab-runs", metavar="DIR", help="runs folder (default proflab-runs)")
    t.add_argument("--rounds", type=int, default=3, metavar="N", help="rounds at least (one run a side each; default 3)")
    t.add_argument("--max-rounds", type=int, default=8, metavar="N", help="rounds at most (default 8)")
    t.add_argument("--target", type=float, default=2.0, metavar="PCT",
                   help="stop once the saving's 95%% interval is within +-PCT%% of the step (default 2)")  # fmt: skip
    t.add_argument("--from", dest="from_path", metavar="RUN_DIR|TRACE", help="predicted saving from this profiled run instead of a new one")
    t.add_argument("--no-predict", dest="predict", action="store_false", help="measure only: no profiled run, no prediction")
    t.add_argument("-f", "--format", choices=("term", "json"), default="term", help="output format (default term)")
    t.set_defaults(func=cmd_try)


def cmd_try(args: argparse.Namespace) -> int:
    from proflab.collect.knobs import parse
    from proflab.collect.trial import TrialOptions, trial
    from proflab.errors import UsageError

    cmd = list(args.trailing)
    if not cmd:
        raise UsageError("give the command after --, e.g. proflab try tf32 -- python train.py")
    if args.rounds < 1 or args.max_rounds < args.rounds:
        raise UsageError("--rounds must be >= 1 and --max-rounds >= --rounds")
    knobs = [parse(x) for x in args.fixes]
    opts = TrialOptions(root=args.out, rounds=args.rounds, max_rounds=args.max_rounds, target_pct=args.target,
                        predict=args.predict, from_path=args.from_path)  # fmt: skip
    t = trial(cmd, knobs, opts)
    if args.format == "json":
        print(json.dumps(t.to_dict(), indent=2))
    else:
        print(text(t))
    return 0


def text(t) -> str:
    lo, hi = t.ci95_pct
    clock = "GPU-side" if t.clock == "gpu" else "host-side"
    n = len(t.base_runs)
    lines = [
        f"proflab try {' '.join(t.knobs)}: {t.verdict}",
        f"  measured: {t.base_ms:.3f} -> {t.fix_ms:.3f} ms a step ({clock}, unprofiled; {n} run(s) a side, interleaved): "
        f"{t.change_pct:+.2f}%, 95% interval {lo:+.2f} to {hi:+.2f}%",
    ]
    p = t.predicted
    if p is not None:
        if p.get("finding"):
            lines.append(f"  predicted: saves {p['predicted_gain_ms']:.3f} ms a step ({p['predicted_gain_pct']:.2f}%) "
                         f"[{p['finding']}, {p.get('model') or 'model'}], from {p['from']}")  # fmt: skip
        else:
            lines.append(f"  predicted: nothing ({p.get('note')}), from {p['from']}")
    if t.inconclusive:
        lines.append(f"  inconclusive: {t.inconclusive}")
    lines += [f"  note: {n}" for n in t.notes]
    lines.append(f"  runs and trial.json: {t.folder}")
    return "\n".join(lines)


