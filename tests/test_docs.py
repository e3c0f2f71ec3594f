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
