"""The front page and the reference in docs/ link to what exists.

README.md is read on GitHub (and from a checkout), so its relative links are checked here with
GitHub's heading anchors; docs/ is built by mkdocs, whose strict build fails on a link to a missing
page or anchor (mkdocs.yml's ``validation`` turns those into warnings, ``--strict`` into errors).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]

_LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _without_code(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans kept (headings use them)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def github_anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = unicodedata.normalize("NFKC", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, numbered as GitHub numbers repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for line in _without_code(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if not m:
            continue
        slug = github_anchor(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    """The relative links of a Markdown file whose target file or heading does not exist."""
    broken = []
    for line in _without_code(path.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)  # a link shown as code is not a link
        for target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else (path.parent / unquote(file_part)).resolve()
            if not dest.exists():
                broken.append(f"{target}: no such file")
            elif anchor and (dest.suffix != ".md" or unquote(anchor) not in anchors(dest)):
                broken.append(f"{target}: no such heading in {dest.name}")
    return broken


def test_readme_links_resolve():
    links = _LINK.findall("\n".join(_without_code((ROOT / "README.md").read_text(encoding="utf-8"))))
    assert any(t.startswith("docs/") for t in links), "the front page links into docs/"
    assert broken_links(ROOT / "README.md") == []


def test_link_check_catches_missing_files_and_headings(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## `nemo-telemetry check SOURCE [--fail-on X]`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page: one\n\n"
        "[ok](other.md#other-page) [ok](other.md#nemo-telemetry-check-source---fail-on-x) [ok](#page-one)\n"
        "[bad](missing.md) [bad](other.md#nope) [bad](#page) [web](https://example.com/x#y)\n"
        "```\n[in code](nowhere.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nope: no such heading in other.md",
        "#page: no such heading in page.md",
    ]


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True, text=True, timeout=300,
    )


def test_docs_build_strict(tmp_path):
    built = _mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "index.html").exists()


@pytest.mark.parametrize(
    ("page", "text", "named"),
    [
        ("index.md", "[x](index.md#no-such-heading)", "index.md"),
        ("index.md", "[x](no-such-page.md)", "index.md"),
        ("not-in-nav.md", "# A page the nav does not list", "not-in-nav.md"),
    ],
    ids=["missing-anchor", "missing-page", "page-not-in-nav"],
)
def test_docs_build_fails_on_a_broken_link(tmp_path, page, text, named):
    """The strict build is a gate: a link to a missing anchor or page, or a page left out of the nav, fails it."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / page).open("a", encoding="utf-8") as f:
        f.write(f"\n{text}\n")
    built = _mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0, built.stdout + built.stderr
    assert named in built.stdout + built.stderr, built.stdout + built.stderr
