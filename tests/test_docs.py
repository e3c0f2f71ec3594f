"""The documentation a newcomer meets: a short README whose commands are CI's, a MkDocs site
that builds with --strict, and example outputs that are what proflab prints now."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_examples", ROOT / "docs" / "gen_examples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_is_read_in_five_minutes():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_links_resolve():
    """Every relative link of the README names a file of the repository."""
    import re

    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8")):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_examples_are_what_proflab_prints_now():
    """docs/examples/ and the README's sample report are written by docs/gen_examples.py from
    shipped traces; a change to the output must regenerate them (python docs/gen_examples.py)."""
    gen = _gen()
    now = gen.examples()
    for name, text in now.items():
        committed = (gen.OUT / name).read_text(encoding="utf-8")
        assert committed == text, f"docs/examples/{name} drifted: run python docs/gen_examples.py"
    assert README.read_text(encoding="utf-8") == gen.readme(now), "README.md's sample report drifted: run python docs/gen_examples.py"


def test_examples_check_fails_on_drift(tmp_path, monkeypatch):
    """The check can fail: an example edited by hand is named."""
    gen = _gen()
    out = tmp_path / "examples"
    out.mkdir()
    for name, text in gen.examples().items():
        (out / name).write_text(text, encoding="utf-8")
    (out / "train_loop.txt").write_text("edited by hand\n", encoding="utf-8")
    monkeypatch.setattr(gen, "OUT", out)
    assert gen.main(["--check"]) == 1


def test_site_builds_strict(tmp_path):
    """mkdocs build --strict: a broken link, a missing snippet or a page left out of the nav
    fails it."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs or mkdocs-material is not installed (the docs extra: pip install -e '.[docs]')")
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    page = (tmp_path / "site" / "reading-a-report" / "index.html").read_text(encoding="utf-8")
    assert "Verdict:" in page, "the generated sample report was not included in the page"


def _readme_commands(readme: Path = README) -> list[list[str]]:
    """Every `proflab ...` line of the README's bash blocks, as argv (comments cut; a
    program path like `.venv/bin/proflab` counts too)."""
    import re
    import shlex

    text = readme.read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            for part in line.split("&&"):
                words = shlex.split(part.split(" #", 1)[0], comments=False)
                if words and words[0].endswith("proflab"):
                    out.append(words[1:])
    return out


def test_every_command_the_readme_shows_is_one_proflab_takes():
    """Parsed by the real parser (not run): a renamed option or command fails here."""
    from proflab.cli import _parser

    cmds = _readme_commands()
    assert len(cmds) >= 10 and {c[0] for c in cmds} >= {"analyze", "run", "try", "compare", "doctor"}
    parser = _parser()
    for argv in cmds:
        head = argv[: argv.index("--")] if "--" in argv else argv
        try:
            parser.parse_args(head)
        except SystemExit as e:  # argparse's way of refusing
            pytest.fail(f"the README shows `proflab {' '.join(argv)}`, which proflab refuses ({e})")


def test_the_main_job_from_a_fresh_clone(tmp_path):
    """The README's first command as a newcomer meets it, on a fresh clone of what is
    committed: its analysis prints what the README's sample shows (the install is what CI's
    own environment did; here the clone's sources run, without their compiled readers: the
    same report)."""
    import os
    import shutil

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to clone")
    clone = tmp_path / "clone"
    got = subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], capture_output=True, text=True, timeout=120, check=False)
    if got.returncode != 0:
        pytest.skip(f"git clone failed here: {got.stderr.strip()[-200:]}")
    (main_job,) = [c for c in _readme_commands(clone / "README.md") if c[:1] == ["analyze"] and c[1].startswith("tests/data/")]
    env = {**os.environ, "PYTHONPATH": str(clone / "src"), "PROFLAB_NO_CACHE": "1"}
    r = subprocess.run([sys.executable, "-m", "proflab", *main_job], capture_output=True, text=True, timeout=300,
                       cwd=clone, env=env, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    text = (clone / "README.md").read_text(encoding="utf-8")  # the clone's own: what that commit promises
    sample = text.split("<!-- sample:begin -->", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    shown = [ln for ln in sample.splitlines()[1:] if not ln.startswith("[...")]  # (after the $ line)
    while shown and not shown[-1]:
        shown.pop()
    assert r.stdout.splitlines()[: len(shown)] == shown
