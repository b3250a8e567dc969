"""LISTs in pages, as the real API server cuts them and as client-go's pager reads them: the
emulator serves ``limit`` and ``continue`` (a snapshot per list, 410 for a token it no longer
holds), the informers list ``LIST_PAGE`` items at a time, and kubectl's chunked ``get`` reads
them all. Through the real ``kubernetes`` client and the real kubectl."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from cli.localrun import write_kubeconfig
from sim.apiserver import KubeEmulator
from tests.deploy.kustomize import kubectl
from worker import informer as informers
from worker.informer import Informer
from worker.kube import api_client

NAMES = [f"ns-{i}" for i in range(7)]


@pytest.fixture
def api() -> Any:
    with KubeEmulator() as emulator:
        for name in reversed(NAMES):  # stored out of order: pages follow the key order
            emulator.store.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            )
        yield emulator


def page(core: CoreV1Api, **kwargs: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(core.list_namespace(_preload_content=False, **kwargs).data)
    return body


def test_a_list_in_pages_is_one_snapshot_in_key_order(api: KubeEmulator) -> None:
    core = CoreV1Api(api_client(url=api.url))
    first = page(core, limit=3)
    assert [n["metadata"]["name"] for n in first["items"]] == NAMES[:3]
    assert first["metadata"]["remainingItemCount"] == 4
    api.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns-later"}})
    second = page(core, limit=3, _continue=first["metadata"]["continue"])
    third = page(core, limit=3, _continue=second["metadata"]["continue"])
    names = [n["metadata"]["name"] for p in (first, second, third) for n in p["items"]]
    assert names == NAMES  # the one created between pages is not in this list's snapshot
    assert "continue" not in third["metadata"]
    versions = {p["metadata"]["resourceVersion"] for p in (first, second, third)}
    assert len(versions) == 1
    with pytest.raises(ApiException) as used:  # a token is good for its next page once
        page(core, limit=3, _continue=first["metadata"]["continue"])
    assert used.value.status == 410 and json.loads(used.value.body)["reason"] == "Expired"


def test_the_informer_lists_in_pages_and_starts_over_when_a_token_expires(
    api: KubeEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(informers, "LIST_PAGE", 2)
    core = CoreV1Api(api_client(url=api.url))
    calls: list[dict[str, Any]] = []

    def listing(**kwargs: Any) -> Any:
        calls.append(kwargs)
        if len(calls) == 2:  # between the first and second page: compacted
            api.expire_pages()
        return core.list_namespace(**kwargs)

    seen: list[str] = []
    informer = Informer(
        "namespaces", listing, lambda _e, obj, _i: seen.append(obj["metadata"]["name"])
    )
    assert informer._relist()
    assert sorted(seen) == NAMES and informer.relists == 1
    # Page 1, its expired continuation, then four pages from the start.
    assert [c.get("_continue") is not None for c in calls] == [False, True, False, True, True, True]
    assert all(c["limit"] == 2 for c in calls)


def test_kubectl_reads_a_chunked_list_to_its_end(api: KubeEmulator, tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    out = subprocess.run(
        [kubectl(), f"--kubeconfig={config}", "get", "namespaces", "--chunk-size=2", "-o", "name"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [f"namespace/{n}" for n in NAMES]
    table = subprocess.run(  # as a Table, the server's columns, page by page
        [kubectl(), f"--kubeconfig={config}", "get", "ns", "--chunk-size=2", "--no-headers"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert [line.split()[0] for line in table.stdout.splitlines()] == NAMES, table.stderr
    limits = [r.query.get("limit") for r in api.requests("list", "/api/v1/namespaces$")]
    assert limits.count("2") >= 4, limits  # four pages of two, asked for in chunks
