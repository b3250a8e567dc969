"""A kustomize-equivalent renderer for the subset ``deploy/`` uses, so CI needs no binary.

Supported, as kustomize does them: ``resources`` (files and directories with a
kustomization), ``namespace`` (set on namespaced objects, and on RBAC subjects of
ServiceAccounts), and ``patches`` with ``path`` (a strategic merge patch matched by kind and
name). Anything else in a kustomization fails the render, so the subset cannot drift silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sim.patches import strategic_merge_patch

CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "ClusterRollbackPolicy",
    "Node",
    "PersistentVolume",
}
SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "patches"}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def render(directory: Path) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise ValueError(f"{directory}: unsupported kustomization fields {sorted(unknown)}")
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            objects += render(target)
        elif target.is_file():
            objects += _docs(target)
        else:
            raise FileNotFoundError(f"{directory}: resource {entry} does not exist")
    for patch_entry in kustomization.get("patches", []):
        for patch in _docs(directory / patch_entry["path"]):
            matches = [
                o
                for o in objects
                if o["kind"] == patch["kind"] and o["metadata"]["name"] == patch["metadata"]["name"]
            ]
            if len(matches) != 1:
                raise ValueError(
                    f"{directory}: patch {patch_entry['path']} matches {len(matches)} objects"
                )
            index = objects.index(matches[0])
            objects[index] = strategic_merge_patch(matches[0], patch)
    namespace = kustomization.get("namespace")
    if namespace:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = namespace
            for subject in obj.get("subjects") or []:
                if subject.get("kind") == "ServiceAccount":
                    subject["namespace"] = namespace
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    duplicates = {k for k in keys if keys.count(k) > 1}
    if duplicates:
        raise ValueError(f"{directory}: duplicate objects {sorted(map(str, duplicates))}")
    return objects
