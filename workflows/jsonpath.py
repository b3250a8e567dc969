"""The JSONPath of CRD printer columns, the two shapes they use: ``.a.b`` and
``.list[?(@.key=="value")].field``. Shared by ``rollbackctl get policies`` and the simulated
cluster's Table output, so both print what ``kubectl get`` prints on a real cluster."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

_FILTER = re.compile(
    r'^(?P<list>[.\w]+)\[\?\(@\.(?P<key>\w+)=="(?P<value>[^"]*)"\)\](?P<rest>[.\w]*)$'
)


def jsonpath(doc: Any, path: str) -> Any:
    """The value at ``path`` in ``doc`` (None when any step is missing)."""
    m = _FILTER.match(path)
    if m is not None:
        items = jsonpath(doc, m["list"]) or []
        found = next(
            (i for i in items if isinstance(i, dict) and i.get(m["key"]) == m["value"]), None
        )
        return jsonpath(found, m["rest"]) if found is not None and m["rest"] else found
    for part in (p for p in path.split(".") if p):
        if not isinstance(doc, dict):
            return None
        doc = doc.get(part)
    return doc


def age(created: str | None, now: datetime) -> str:
    """kubectl's short age of an RFC 3339 timestamp: 45s, 12m, 5h, 3d."""
    if not created:
        return "<unknown>"
    seconds = int((now - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"
