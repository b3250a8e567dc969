"""The house's rules that a reader relies on, checked so they stay true: no function of the
product's core packages is over 60 lines, and each of the intake's modules is under 300."""

from __future__ import annotations

import ast

from tests.conftest import ROOT

MAX_FUNCTION = 60
MAX_INTAKE_MODULE = 300


def test_no_function_in_worker_workflows_or_activities_is_over_60_lines() -> None:
    long = []
    for package in ("worker", "workflows", "activities"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > MAX_FUNCTION:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {lines}")
    assert long == []


def test_each_module_of_the_intake_is_under_300_lines() -> None:
    sizes = {
        path.name: len(path.read_text().splitlines())
        for path in (ROOT / "worker" / "intake").glob("*.py")
    }
    assert {"watching.py", "causes.py", "delivery.py", "controls.py"} <= set(sizes)
    assert all(n < MAX_INTAKE_MODULE for n in sizes.values()), sizes
