"""The documentation holds together: a short README that links every page of docs/,
relative links that lead to files, every page in the site's nav, and a site that
builds with `mkdocs build --strict` (a broken link or a page left out fails it)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# Every Markdown file whose relative links must lead somewhere.
CHECKED = [README, ROOT / "benchmarks" / "README.md", *DOCS]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)


def relative_links(text: str) -> list[str]:
    """The link targets of a Markdown text that are paths in the repository (code
    blocks and code spans are not links; URLs and same-page anchors are left out)."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", text))
    out = []
    for target in _LINK.findall(text) + _REF_DEF.findall(text):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target)
    return out


def broken_links(path: Path) -> list[str]:
    """The relative links of `path` whose file does not exist."""
    bad = []
    for target in relative_links(path.read_text(encoding="utf-8")):
        file_part = target.split("#", 1)[0]
        if not (path.parent / file_part).exists():
            bad.append(target)
    return bad


def test_the_readme_is_at_most_300_lines() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 300, f"README.md has {n} lines; the limit is 300 (details belong in docs/)"


def test_the_readme_keeps_the_two_quickstart_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {
        (ROOT / t.split("#", 1)[0]).resolve()
        for t in relative_links(README.read_text(encoding="utf-8"))
    }
    missing = [p.name for p in DOCS if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_every_docs_page_is_in_the_mkdocs_nav() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = config[config.index("\nnav:") :]
    in_nav = set(re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?([\w./-]+\.md)\s*$", nav, re.M))
    missing = [p.name for p in DOCS if p.name not in in_nav]
    assert not missing, f"docs pages missing from mkdocs.yml's nav: {missing}"


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_existing_files(path: Path) -> None:
    assert broken_links(path) == [], f"{path.relative_to(ROOT)} links to files that do not exist"


def test_the_link_check_catches_a_broken_link(tmp_path: Path) -> None:
    """The check can fail: a page with one good and one broken link (and a broken
    one inside a code block, which is not a link) is caught on the broken one only."""
    (tmp_path / "there.md").write_text("x\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md#a) [gone](missing.md) [web](https://example.com) [top](#x)\n"
        "```\n[code](nowhere.md)\n```\n`[span](nowhere2.md)`\n"
    )
    assert broken_links(page) == ["missing.md"]


def _mkdocs() -> list[str]:
    if (
        importlib.util.find_spec("mkdocs") is None
        or importlib.util.find_spec("mkdocstrings") is None
    ):
        pytest.skip(
            "mkdocs or mkdocstrings is not installed: `make install-dev` installs them "
            "(pip install mkdocs mkdocs-material 'mkdocstrings[python]')"
        )
    return [sys.executable, "-m", "mkdocs", "build", "--strict"]


def _build(config_dir: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [*_mkdocs(), "-f", str(config_dir / "mkdocs.yml"), "-d", str(site)],
        cwd=config_dir,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_the_docs_site_builds_strict(tmp_path: Path) -> None:
    r = _build(ROOT, tmp_path / "site")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    reference = (tmp_path / "site" / "reference" / "index.html").read_text(encoding="utf-8")
    for name in (
        "segue.Flow",
        "segue.client.BaseClient",
        "segue.data",
        "segue.inference.ModelHandler",
    ):
        assert f'id="{name}"' in reference, f"the API reference has no entry for {name}"


def test_the_strict_build_fails_on_a_broken_link_and_a_page_outside_nav(tmp_path: Path) -> None:
    """The build can fail: a copy of the site with a link to a missing page and a
    page that nav leaves out is refused, naming both."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "src").symlink_to(ROOT / "src")
    data = tmp_path / "docs" / "data.md"
    data.write_text(
        data.read_text(encoding="utf-8") + "\nSee [the lost page](lost-page.md).\n",
        encoding="utf-8",
    )
    (tmp_path / "docs" / "orphan-page.md").write_text("# An orphan\n", encoding="utf-8")
    r = _build(tmp_path, tmp_path / "site")
    assert r.returncode != 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "lost-page.md" in r.stderr, r.stderr[-3000:]
    assert "orphan-page.md" in r.stderr, r.stderr[-3000:]
