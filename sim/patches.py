"""The three patch types of the Kubernetes API: JSON merge, strategic merge and JSON patch.

Strategic merge patch merges lists of objects by their merge key (containers by ``name``,
conditions by ``type``, ...) the way the API server does for built-in types; other lists are
replaced. ``null`` deletes a key; ``{"$patch": "delete", <key>: ...}`` deletes a list item.
"""

from __future__ import annotations

import copy
from typing import Any

# Field name -> merge key, for the built-in list fields the project touches.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "resizePolicy": "resourceName",
    "tolerations": "key",
}


class PatchError(ValueError):
    """A patch that cannot be applied (the API server answers 422/400)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, field: str = "") -> Any:
    if isinstance(patch, list):
        key = MERGE_KEYS.get(field)
        if key is None or not isinstance(target, list):
            return [copy.deepcopy(p) for p in patch if not _is_delete(p)]
        merged = [copy.deepcopy(item) for item in target]
        for item in patch:
            if not isinstance(item, dict) or key not in item:
                raise PatchError(f"{field}: list items need the merge key {key!r}")
            index = next((i for i, t in enumerate(merged) if t.get(key) == item[key]), None)
            if _is_delete(item):
                if index is not None:
                    merged.pop(index)
            elif index is None:
                merged.append(strategic_merge_patch({}, item))
            else:
                merged[index] = strategic_merge_patch(merged[index], item)
        return merged
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if name.startswith("$"):
            continue
        if value is None:
            result.pop(name, None)
        else:
            result[name] = strategic_merge_patch(result.get(name), value, name)
    return result


def _is_delete(item: Any) -> bool:
    return isinstance(item, dict) and item.get("$patch") == "delete"


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, parts[-1]


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902: add, remove, replace, move, copy, test."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch is a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        try:
            doc = _apply_op(doc, op)
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise PatchError(f"{op}: {exc}") from exc
    return doc


def _get(doc: Any, path: str) -> Any:
    node = doc
    for part in _pointer(path):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _apply_op(doc: Any, op: dict[str, Any]) -> Any:
    kind, path = op["op"], op["path"]
    if kind == "test":
        if _get(doc, path) != op["value"]:
            raise ValueError("test failed")
        return doc
    if kind in ("move", "copy"):
        value = copy.deepcopy(_get(doc, op["from"]))
        if kind == "move":
            doc = _apply_op(doc, {"op": "remove", "path": op["from"]})
        return _apply_op(doc, {"op": "add", "path": path, "value": value})
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(op["value"]) if kind in ("add", "replace") else None
    parent, last = _parent(doc, parts)
    if kind == "remove":
        if isinstance(parent, list):
            parent.pop(int(last))
        else:
            del parent[last]
    elif kind == "add":
        if isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(op["value"]))
        else:
            parent[last] = copy.deepcopy(op["value"])
    elif kind == "replace":
        if isinstance(parent, list):
            parent[int(last)] = copy.deepcopy(op["value"])
        else:
            if last not in parent:
                raise KeyError(last)
            parent[last] = copy.deepcopy(op["value"])
    else:
        raise ValueError(f"unknown op {kind!r}")
    return doc
