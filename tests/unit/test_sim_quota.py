"""The emulator's ResourceQuota and LimitRange admission of pods (``sim.admission``), as the
API server's plugins answer: on create and on ``pods/resize``."""

from __future__ import annotations

from typing import Any

import pytest

from sim.apiserver import RESOURCE_TYPES, ApiError, Store

NS = "shop"


def pod(name: str, memory: str | None, limit: str | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if memory is not None:
        resources["requests"] = {"memory": memory}
    if limit is not None:
        resources["limits"] = {"memory": limit}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": "app", "image": "x", "resources": resources}]},
        "status": {"phase": "Running"},
    }


def resize(store: Store, name: str, memory: str) -> dict[str, Any]:
    body = {
        "spec": {"containers": [{"name": "app", "resources": {"requests": {"memory": memory}}}]}
    }
    return store.patch(
        store.rtype("Pod"), NS, name, body, "application/strategic-merge-patch+json", "resize"
    )


def store_with(*objects: dict[str, Any]) -> Store:
    store = Store(RESOURCE_TYPES)
    for obj in objects:
        store.create(
            {"apiVersion": "v1", "metadata": {"namespace": NS, **obj.pop("metadata")}, **obj}
        )
    return store


def quota(**hard: str) -> dict[str, Any]:
    return {"kind": "ResourceQuota", "metadata": {"name": "compute"}, "spec": {"hard": hard}}


def test_a_quota_refuses_a_create_and_a_resize_past_it_and_charges_only_the_increase() -> None:
    store = store_with(quota(**{"requests.memory": "1Gi"}))
    store.create(pod("a", "512Mi"))
    store.create(pod("b", "512Mi"))
    with pytest.raises(ApiError) as created:
        store.create(pod("c", "1Mi"))
    assert (created.value.code, created.value.reason) == (403, "Forbidden")
    assert created.value.message == (
        'pods "c" is forbidden: exceeded quota: compute, requested: requests.memory=1Mi,'
        " used: requests.memory=1Gi, limited: requests.memory=1Gi"
    )
    with pytest.raises(ApiError) as grown:
        resize(store, "a", "768Mi")
    assert grown.value.message == (
        'pods "a" is forbidden: exceeded quota: compute, requested: requests.memory=256Mi,'
        " used: requests.memory=1Gi, limited: requests.memory=1Gi"
    )
    resize(store, "a", "256Mi")  # shrinking is never refused
    assert resize(store, "b", "768Mi")["spec"]["containers"][0]["resources"]["requests"] == {
        "memory": "768Mi"
    }  # the room "a" freed
    store.patch(store.rtype("Pod"), NS, "a", {"status": {"phase": "Succeeded"}},
                "application/merge-patch+json", "status")  # fmt: skip
    store.create(pod("c", "256Mi"))  # a finished pod is no longer charged


def test_a_quota_needs_each_pod_to_say_what_it_charges() -> None:
    store = store_with(quota(**{"limits.memory": "4Gi"}))
    with pytest.raises(ApiError) as info:
        store.create(pod("a", "512Mi"))
    assert (
        info.value.message
        == 'pods "a" is forbidden: failed quota: compute: must specify limits.memory'
    )


def test_a_limit_range_defaults_on_create_and_bounds_every_resize() -> None:
    limits = {"type": "Container", "max": {"memory": "1Gi"}, "min": {"memory": "64Mi"},
              "default": {"memory": "512Mi"}, "defaultRequest": {"memory": "256Mi"}}  # fmt: skip
    store = store_with(
        {"kind": "LimitRange", "metadata": {"name": "bounds"}, "spec": {"limits": [limits]}}
    )
    made = store.create(pod("a", None))
    assert made["spec"]["containers"][0]["resources"] == {
        "limits": {"memory": "512Mi"},
        "requests": {"memory": "256Mi"},
    }
    with pytest.raises(ApiError) as high:
        resize(store, "a", "2Gi")
    assert high.value.code == 403 and high.value.message == (
        'pods "a" is forbidden: maximum memory usage per Container is 1Gi, but request is 2Gi'
    )
    with pytest.raises(ApiError) as low:
        store.create(pod("b", "32Mi", "32Mi"))
    assert low.value.message == (
        'pods "b" is forbidden: minimum memory usage per Container is 64Mi, but request is 32Mi'
    )
