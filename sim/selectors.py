"""Label and field selectors in their string form, as the API server parses them.

``parse_label_selector("app=web,tier in (api,worker),!legacy")`` gives requirements that
``matches(labels)`` checks. (Clients render selectors with ``LabelSelector.to_query``.)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Requirement = Callable[[Mapping[str, str]], bool]

_SET = re.compile(r"^\s*(?P<key>[^\s!=]+)\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)\s*$")
_EQ = re.compile(r"^\s*(?P<key>[^\s!=]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s,]*)\s*$")
_EXISTS = re.compile(r"^\s*(?P<neg>!?)\s*(?P<key>[^\s!=(),]+)\s*$")


def _split(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return parts


def parse_label_selector(selector: str | None) -> list[Requirement]:
    """Requirements of a label selector string; raises ``ValueError`` on a malformed one."""
    requirements: list[Requirement] = []
    for part in _split(selector or ""):
        requirements.append(_requirement(part))
    return requirements


def _requirement(part: str) -> Requirement:
    if m := _SET.match(part):
        key, values = m["key"], {v.strip() for v in m["values"].split(",") if v.strip()}
        inside = m["op"] == "in"
        return lambda labels: (labels.get(key) in values) == inside
    if m := _EQ.match(part):
        key, value, equal = m["key"], m["value"], m["op"] != "!="
        return lambda labels: (labels.get(key) == value) == equal
    if m := _EXISTS.match(part):
        key, present = m["key"], not m["neg"]
        return lambda labels: (key in labels) == present
    raise ValueError(f"unable to parse requirement: {part.strip()!r}")


def matches(requirements: list[Requirement], labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    return all(r(labels) for r in requirements)


def parse_field_selector(selector: str | None) -> list[Callable[[dict[str, Any]], bool]]:
    """``metadata.name=x,spec.nodeName!=y``: equality on dotted paths, strings compared."""
    checks: list[Callable[[dict[str, Any]], bool]] = []
    for part in _split(selector or ""):
        m = _EQ.match(part)
        if m is None:
            raise ValueError(f"invalid field selector: {part.strip()!r}")
        path, value, negate = m["key"].split("."), m["value"], m["op"] == "!="

        def check(
            obj: dict[str, Any], path: list[str] = path, value: str = value, negate: bool = negate
        ) -> bool:
            node: Any = obj
            for step in path:
                node = node.get(step) if isinstance(node, dict) else None
            actual = "" if node is None else str(node)
            return (actual == value) != negate

        checks.append(check)
    return checks
