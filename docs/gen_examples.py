"""Write the example outputs the documentation shows, from traces that ship with the repository.

    python docs/gen_examples.py            # rewrite docs/examples/
    python docs/gen_examples.py --check    # exit 1, naming the files, where they differ

The pages include these files (pymdownx.snippets), so an example is never typed by hand, and
tests/test_docs.py fails when what proflab prints now differs from what the pages show.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "examples"
KINETO = "tests/data/kineto"

# The sample report of the README and of "Reading a report": a real H100 training loop.
SAMPLE = f"{KINETO}/train_loop.pt.trace.json.gz"
# One recorded trace per planted bottleneck (tests/data/kineto/README.md says how each was made).
PLANTED = {
    "sync_every_step": "a loss read with .item() every step",
    "starved_input": "a DataLoader with no workers",
    "tiny_kernels": "many tiny kernels",
    "pageable_h2d": "copies from pageable memory",
    "fp32_matmul_no_tf32": "FP32 matmuls with TF32 off",
    "memory_bound_elementwise": "memory-bound elementwise work",
    "healthy_bf16_gemm": "a healthy BF16 GEMM loop (the control)",
}


def _cli(*argv: str) -> str:
    """What `proflab ARGV` prints on stdout, run in this process (from the repository root, so
    the paths printed are the repository's own)."""
    sys.path.insert(0, str(ROOT / "src"))
    from proflab.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(list(argv))
    if rc != 0:
        raise SystemExit(f"proflab {' '.join(argv)} exited {rc}")
    return buf.getvalue()


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _findings_table() -> str:
    rows = ["| trace (what was planted) | finding | severity | predicted gain | `proflab try` |", "|---|---|---|---:|---|"]
    for name, what in PLANTED.items():
        doc = json.loads(_cli("analyze", f"{KINETO}/{name}.pt.trace.json.gz", "-f", "json", "--no-cache"))
        for f in doc["findings"]:
            gain = f"{f['est_gain_ms']:.3g} ms ({f['est_gain_pct']:.3g}%)" if f.get("est_gain_ms") else "-"
            knob = f["evidence"].get("proflab_try")
            rows.append(f"| `{name}` ({what}) | `{f['id']}` | {f['severity']} | {gain} | {f'`{knob}`' if knob else '-'} |")
    return "\n".join(rows) + "\n"


def examples() -> dict[str, str]:
    """File name under docs/examples -> its content, as proflab prints it now."""
    cwd = Path.cwd()
    try:
        os.chdir(ROOT)
        return {
            "train_loop.txt": _cli("analyze", SAMPLE, "--width", "80", "--no-cache"),
            "train_loop.md": _cli("analyze", SAMPLE, "-f", "md", "--no-cache"),
            "sync_every_step.txt": _cli("analyze", f"{KINETO}/sync_every_step.pt.trace.json.gz", "--width", "80", "--no-cache"),
            "planted_findings.md": _findings_table(),
        }
    finally:
        os.chdir(cwd)


BEGIN, END = "<!-- sample:begin -->", "<!-- sample:end -->"


def readme_sample(report: str) -> str:
    """The README's sample: the sample report's summary screen (what it prints before its
    details), in a fenced block."""
    lines = report.splitlines()
    stop = next((i for i, ln in enumerate(lines) if ln == "Details"), len(lines))
    body = "\n".join(lines[:stop]).rstrip()
    more = (f"\n\n[... {len(lines) - stop} lines of details follow: the timeline, each finding's evidence, fix and "
            "where, the hot kernels, where the FLOPs go, what is missing]" if stop < len(lines) else "")
    return f"```text\n$ proflab analyze {SAMPLE}\n{body}{more}\n```"


def readme(now: dict[str, str]) -> str:
    """README.md with its sample block rewritten from the sample report."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{readme_sample(now['train_loop.txt'])}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare with docs/examples instead of writing")
    args = p.parse_args(argv)
    now = examples()
    if args.check:
        stale = [f"docs/examples/{n}" for n, text in now.items() if not (OUT / n).exists() or (OUT / n).read_text(encoding="utf-8") != text]
        if (ROOT / "README.md").read_text(encoding="utf-8") != readme(now):
            stale.append("README.md (its sample report)")
        for n in stale:
            print(f"{n} differs from what proflab prints now: run python docs/gen_examples.py", file=sys.stderr)
        return 1 if stale else 0
    OUT.mkdir(exist_ok=True)
    for n, text in now.items():
        (OUT / n).write_text(text, encoding="utf-8")
        print(f"wrote docs/examples/{n}")
    (ROOT / "README.md").write_text(readme(now), encoding="utf-8")
    print("wrote README.md's sample report")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
