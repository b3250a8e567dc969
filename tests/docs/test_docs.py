"""The docs: the README stays short and leads to every page in at most two clicks, the generated
pages are what the code makes now (``python -m cli.docs``), and the site builds with
``mkdocs build --strict`` (a broken link, anchor, snippet or a page outside the nav fails)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import temporalio
import yaml

from cli import docs
from cli.main import build_parser
from tests.conftest import ROOT, chromium
from worker.config import IntakeConfig, WorkerConfig
from workflows.contract import FailureReason, Mode, SearchAttribute
from workflows.machine import brings_back
from workflows.rollback import RollbackWorkflow

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
    site = tmp_path / "site"
    # The snippets are in: the README's things to try, the results, the chart's values.
    assert "plays a shipped scenario" in (site / "getting-started.html").read_text()
    assert "Soak: many workloads" in (site / "benchmarks.html").read_text()
    assert "kubeTimeoutSeconds" in (site / "operating/install.html").read_text()
    # Opened from disk (file://), every link of every page leads to a file, not a directory
    # (but the 404 page's: a web server's, at the site's root).
    for page in set(site.rglob("*.html")) - {site / "404.html"}:
        for href in re.findall(r'href="([^"#?]*)[^"]*"', page.read_text()):
            if href and not re.match(r"[a-z]+:", href):
                assert (page.parent / href).is_file(), f"{page.relative_to(site)}: {href}"
    # The state machine's diagram renders with no network at all: mermaid comes with the site
    # (the theme's CDN fetch would fail and leave its source on the page).
    shown = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=10000", "--dump-dom",
         (site / "concepts/state-machine.html").as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert '<div class="mermaid">' in shown.stdout and "<code>stateDiagram" not in shown.stdout


def test_the_chart_readme_describes_every_value() -> None:
    """The chart README's table (generated, checked above with the pages) has a row for every
    key of values.yaml, and each says what it is for: no empty cell."""
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
        assert rows[key], f"{key}: no description"


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(docs.DOCS.rglob("*.md"))]


def test_every_variable_the_docs_name_is_read() -> None:
    """An environment variable a page names is read by our code, or (TEMPORAL_*) by the SDK's
    envconfig, which ours loads; none is documented that nothing reads."""
    named = {
        v
        for page in _pages()
        for v in re.findall(r"\b(?:ROLLBACK|TEMPORAL)_[A-Z_]*[A-Z]", page.read_text())
    }
    ours = "".join(
        p.read_text()
        for d in ("worker", "cli", "activities", "sim", "workflows")
        for p in (ROOT / d).rglob("*.py")
    )
    sdk = Path(temporalio.__file__).parent
    envconfig = "".join(p.read_text(errors="ignore") for p in sdk.rglob("envconfig*"))
    missing = sorted(
        v for v in named if v not in ours and not (v.startswith("TEMPORAL_") and v in envconfig)
    )
    assert named and missing == []


def _arguments(
    parser: argparse.ArgumentParser, path: str = "rollbackctl"
) -> Iterator[tuple[str, argparse.Action]]:
    """Every argument of every command (its subcommands too), with the command it belongs to."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield path, action
            for name, sub in action.choices.items():
                yield from _arguments(sub, f"{path} {name}")
        else:
            yield path, action


def test_every_command_and_argument_says_what_it_is() -> None:
    """No empty cell in the CLI reference, no bare name in ``--help``, and each command's
    ``--help`` opens with what it does."""
    arguments = list(_arguments(build_parser()))
    bare = [
        f"{c} {a.option_strings or a.dest}"
        for c, a in arguments
        if not a.help and not isinstance(a, argparse._SubParsersAction)
    ]
    assert bare == []
    commands = [
        (name, parser)
        for _, action in arguments
        if isinstance(action, argparse._SubParsersAction)
        for name, parser in action.choices.items()
    ]
    assert commands and [name for name, parser in commands if not parser.description] == []


def test_every_rollbackctl_flag_the_docs_name_exists() -> None:
    """Each ``-x``/``--flag`` in a ``rollbackctl ...`` command a page prints is one the parser
    takes."""
    flags = {f for _, action in _arguments(build_parser()) for f in action.option_strings}
    unknown = []
    for page in _pages():
        for command in re.findall(r"rollbackctl [^`\n]*", page.read_text()):
            for token in command.split(" #", 1)[0].split()[1:]:  # a shell comment ends it
                flag = token.split("=", 1)[0].rstrip(".,;:)")
                if re.fullmatch(r"--?[A-Za-z][A-Za-z-]*", flag) and flag not in flags:
                    unknown.append(f"{page.name}: {flag} in `{command}`")
    assert flags and unknown == []


def test_every_worker_and_intake_command_the_docs_print_runs_as_written() -> None:
    """Each ``rollbackctl worker|intake ...`` line of a page's code blocks makes a configuration
    as printed, with no environment to lean on (one once lacked the required ``--cluster``)."""
    configs = {"worker": WorkerConfig, "intake": IntakeConfig}
    commands = [
        (page.name, line.split(" #", 1)[0].split())
        for page in _pages()
        for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", page.read_text(), re.S)
        for line in block.splitlines()
        if re.match(r"\s*rollbackctl (worker|intake) ", line)
    ]
    assert len(commands) >= 2
    for page, argv in commands:
        config = configs[argv[1]].from_args(build_parser().parse_args(argv[1:]), env={})
        assert config.cluster, (page, argv)


def test_the_policy_commands_the_docs_show_print_what_they_show() -> None:
    """Each ``rollbackctl policy ...`` a page shows with its output, over files of this
    repository (``deploy/examples/``; the reader's own ``bad.yaml`` and the like are not here),
    prints that output, line for line (the examples' count once said 3 when they were 4)."""
    compared = []
    for page in _pages():
        for block in re.findall(r"```console\n(.*?)```", page.read_text(), re.S):
            for part in re.split(r"^\$ ", block, flags=re.M)[1:]:
                command, *shown = part.rstrip("\n").split("\n")
                words = command.split()
                files = [w for w in words[3:] if w.endswith(".yaml")]
                if words[:2] != ["rollbackctl", "policy"] or not all(
                    list(ROOT.glob(f)) for f in files
                ):
                    continue
                # As a reader's shell runs it: its globs expanded, the venv's rollbackctl.
                path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
                real = subprocess.run(
                    command, shell=True, cwd=ROOT, capture_output=True, text=True, check=False,
                    env={**os.environ, "PATH": path},
                )  # fmt: skip
                assert real.stdout.rstrip("\n").split("\n") == shown, (page.name, command)
                compared.append(command)
    assert len(compared) >= 2, compared


def test_the_workflow_page_names_every_signal_update_query_and_search_attribute() -> None:
    """The "Signals, Updates and queries" table and the search-attribute list, against the
    workflow's handlers and ``SearchAttribute``."""
    page = (docs.DOCS / "concepts" / "workflow.md").read_text()
    definition = getattr(RollbackWorkflow, "__temporal_workflow_definition")
    handlers = [*definition.signals, *definition.queries, *definition.updates]
    assert len(handlers) >= 9
    named = set(re.findall(r"^\| `([a-z_]+)` \|", page, re.M))
    assert sorted(set(handlers) - named) == []
    assert [a.value for a in SearchAttribute if f"`{a.value}`" not in page] == []


def test_the_simulated_cluster_page_names_every_shipped_scenario() -> None:
    page = (docs.DOCS / "simulated-cluster.md").read_text()
    shipped = sorted(p.stem for p in (ROOT / "sim" / "scenarios").glob("*.yaml"))
    assert len(shipped) >= 30
    assert [name for name in shipped if f"`{name}`" not in page] == []


def test_the_troubleshooting_table_explains_every_mode_and_failure_reason() -> None:
    page = (docs.DOCS / "operating" / "troubleshooting.md").read_text()
    table = "\n".join(line for line in page.splitlines() if line.startswith("| `"))
    named = [*Mode, *FailureReason]
    assert len(named) > 25
    assert [v.value for v in named if f"`{v.value}`" not in table] == []


@pytest.mark.parametrize("page", ["reference/scenarios.md", "reference/policy.md"])
def test_the_generated_references_leave_no_description_empty(page: str) -> None:
    """Every field's row says what it is, and every section opens with a sentence (the words
    come from the models' docstrings: ``use_attribute_docstrings``, ``Field(description)``)."""
    text = (docs.DOCS / page).read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) > 40
    assert [
        row.split("|")[1].strip() for row in rows if not row.rstrip(" |").rsplit("|", 1)[1].strip()
    ] == []
    sections = re.split(r"^## .*$", text, flags=re.M)[1:]
    assert [s[:60] for s in sections if s.strip().startswith("|")] == []  # a table first


GLOSSARY = docs.DOCS / "glossary.md"
# What is not prose: fenced and indented blocks, inline code, headings, HTML comments, a
# table's rows (a cell is a name or a value, not a sentence), another link (a glossary link's
# text is the use it links).
NOT_PROSE = re.compile(
    r"```[\s\S]*?```|`[^`\n]*`|^#.*$|<!--[\s\S]*?-->|^[ \t]*\|.*$|^ {4,}\S.*$", re.M
)
LINK = re.compile(r"\[([^\]]*)\]\(([^)]*)\)")


def _prose(text: str) -> str:
    """``text`` with what is not prose blanked out, each character kept in its place."""
    masked = NOT_PROSE.sub(lambda m: " " * len(m[0]), text)

    def link(m: re.Match[str]) -> str:
        if "glossary.md" in m[2]:
            return f"[{m[1]}]" + " " * (len(m[2]) + 2)
        return " " * len(m[0])

    return LINK.sub(link, masked)


def glossary_terms() -> list[str]:
    return re.findall(r"^### (.+)$", GLOSSARY.read_text(encoding="utf-8"), re.M)


def first_use(text: str, term: str) -> re.Match[str] | None:
    """The first use of ``term`` in the page's prose (its plural too), or None."""
    flags = 0 if term[0].isupper() else re.I
    return re.search(rf"(?<![\w./-]){re.escape(term)}s?(?![\w-])", _prose(text), flags)


def _prose_pages() -> list[Path]:
    return [
        p
        for p in sorted(docs.DOCS.rglob("*.md"))
        if p != GLOSSARY
        and "reference" not in p.relative_to(docs.DOCS).parts
        and str(p.relative_to(docs.DOCS)) not in docs.PAGES  # generated from the code
    ]


@pytest.mark.parametrize("page", _prose_pages(), ids=lambda p: str(p.relative_to(docs.DOCS)))
def test_each_page_links_a_glossary_word_where_it_first_uses_it(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    target = os.path.relpath(GLOSSARY, page.parent)
    unlinked = []
    for term in glossary_terms():
        found = first_use(text, term)
        if found is None:
            continue
        after = text[found.end() : found.end() + 200]
        anchor = term.lower().replace(" ", "-")
        if not (text[found.start() - 1] == "[" and after.startswith(f"]({target}#{anchor})")):
            line = text.count("\n", 0, found.start()) + 1
            unlinked.append(f"{term} (line {line})")
    assert not unlinked, f"link the first use to the glossary ({target}#...): {unlinked}"


def test_the_table_of_what_brings_a_cut_back_is_the_machines_rule() -> None:
    """Each row of the status and control page's table (before, after, held) is what
    ``machine.brings_back`` says of it: a mode in backticks (``no state``: none), ``published``
    when a rollback is on the owner before, ``cleared`` when the write removes it."""
    page = (docs.DOCS / "concepts/status-and-control.md").read_text()
    table = page.split("<!-- brings-back -->")[1].split("<!-- /brings-back -->")[0]
    rows = [r.split("|")[1:-1] for r in table.strip().splitlines()[2:]]
    assert len(rows) >= 9

    def mode(cell: str) -> Mode | None:
        found = re.search(r"`(\w+)`", cell)
        assert found or "no state" in cell, cell
        return Mode(found.group(1)) if found else None

    for what, before, after, held in rows:
        says = brings_back(
            mode(before), mode(after), published="published" in before, clears="cleared" in after
        )
        assert says == (held.strip() == "yes"), what
