"""The docs: the README stays short and leads to every page in at most two clicks, the generated
pages are what the code makes now (``python -m cli.docs``), and the site builds with
``mkdocs build --strict`` (a broken link, anchor, snippet or a page outside the nav fails)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli import docs
from tests.conftest import ROOT

README_MAX_LINES = 150


def _nav_pages() -> set[str]:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)

    def walk(node: object) -> set[str]:
        if isinstance(node, str):
            return {node}
        if isinstance(node, list):
            return set().union(*(walk(n) for n in node))
        if isinstance(node, dict):
            return set().union(*(walk(v) for v in node.values()))
        return set()

    return walk(config["nav"])


def _links(path: Path) -> set[str]:
    """The docs pages a Markdown file links to, as paths under docs/."""
    found = set()
    for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", path.read_text()):
        resolved = (path.parent / target).resolve()
        if resolved.is_relative_to(docs.DOCS):
            found.add(str(resolved.relative_to(docs.DOCS)))
    return found


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)


def test_every_page_is_in_the_nav_and_two_clicks_from_the_readme() -> None:
    pages = {str(p.relative_to(docs.DOCS)) for p in docs.DOCS.rglob("*.md")}
    assert pages == _nav_pages()
    first = _links(ROOT / "README.md")
    second = set().union(*(_links(docs.DOCS / page) for page in first))
    assert pages - (first | second) == set()


@pytest.mark.parametrize("page", [*docs.PAGES, "README.md"])
def test_generated_pages_are_current(page: str) -> None:
    if page == "README.md":
        path, made = ROOT / page, docs.readme((ROOT / page).read_text())
    else:
        path, made = docs.DOCS / page, docs.PAGES[page]()
    assert path.read_text() == made, f"{page} is stale: run `make docs` (python -m cli.docs)"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    out = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # The snippets are in: the README's things to try, the results, the chart's values.
    assert "plays a shipped scenario" in (tmp_path / "site/getting-started/index.html").read_text()
    assert "Soak: many workloads" in (tmp_path / "site/benchmarks/index.html").read_text()
    assert "kubeTimeoutSeconds" in (tmp_path / "site/operating/install/index.html").read_text()
