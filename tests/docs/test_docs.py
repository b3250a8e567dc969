"""The docs: the README stays short and leads to every page in at most two clicks, the generated
pages are what the code makes now (``python -m cli.docs``), and the site builds with
``mkdocs build --strict`` (a broken link, anchor, snippet or a page outside the nav fails)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


CHART_README = "charts/rightsizing-rollback/README.md"


@pytest.mark.parametrize("page", [*docs.PAGES, "README.md", CHART_README])
def test_generated_pages_are_current(page: str) -> None:
    if page == "README.md":
        path, made = ROOT / page, docs.readme((ROOT / page).read_text())
    elif page == CHART_README:
        path, made = ROOT / page, docs.chart_readme()
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


def test_the_chart_readme_describes_every_value() -> None:
    """The chart README's table (generated, checked above with the pages) has a row for every
    key of values.yaml, and each says what it is for, itself or in the row of its parent."""
    text = (docs.CHART / "README.md").read_text()
    rows = {
        line.split("`")[1]: line.rstrip(" |").rsplit("|", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("| `")
    }

    def leaves(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
        for key, value in values.items():
            if f"{prefix}{key}" in rows:
                yield f"{prefix}{key}"
            elif isinstance(value, dict):
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}"  # missing: fails below

    values = yaml.safe_load((docs.CHART / "values.yaml").read_text())
    for key in leaves(values):
        assert key in rows, f"{key}: no row"
        parent = key.rsplit(".", 1)[0]
        assert rows[key] or rows.get(parent), f"{key}: no description"
