"""The API client every process builds (worker.kube.api_client): timeouts and in-call retries.

Through the real ``kubernetes`` client over HTTP against the emulator, counting requests in its
journal.
"""

from __future__ import annotations

import time

import pytest
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ReadTimeoutError

from sim.apiserver import Fault, KubeEmulator
from worker.kube import api_client

NS = "default"


def config_map(name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": NS}, "data": {"k": "v"}}


def test_a_transient_server_error_on_a_read_is_retried_in_the_call(api: KubeEmulator) -> None:
    api.store.create({"apiVersion": "v1", "kind": "ConfigMap", **config_map("c")})
    api.inject(Fault(status=500, method="GET", path="/configmaps", times=2))
    with api_client(url=api.url) as client:
        got = CoreV1Api(client).read_namespaced_config_map("c", NS)
    assert got.data == {"k": "v"}
    assert [r.status for r in api.requests("get")] == [500, 500, 200]


def test_a_persistent_server_error_surfaces_after_a_few_tries(api: KubeEmulator) -> None:
    api.inject(Fault(status=500, method="GET", path="/configmaps", times=None))
    with api_client(url=api.url) as client, pytest.raises(ApiException) as info:
        CoreV1Api(client).read_namespaced_config_map("c", NS)
    assert info.value.status == 500
    assert len(api.requests("get")) == 4  # the first try and three retries


def test_a_failed_write_is_left_to_the_caller(api: KubeEmulator) -> None:
    """A 500 on a write may hide a processed write: retrying it is the caller's decision."""
    api.inject(Fault(status=500, method="POST", path="/configmaps"))
    with api_client(url=api.url) as client, pytest.raises(ApiException) as info:
        CoreV1Api(client).create_namespaced_config_map(NS, config_map("c"))
    assert info.value.status == 500
    assert len(api.requests("create")) == 1


def test_a_throttled_write_is_retried_after_retry_after(api: KubeEmulator) -> None:
    """429 means not processed, on any verb; the client waits the server's Retry-After."""
    api.inject(Fault(status=429, method="POST", path="/configmaps"))
    started = time.monotonic()
    with api_client(url=api.url) as client:
        CoreV1Api(client).create_namespaced_config_map(NS, config_map("c"))
    assert time.monotonic() - started >= 0.9
    assert [r.status for r in api.requests("create")] == [429, 201]
    assert api.store.get(api.store.rtype("ConfigMap"), NS, "c")["data"] == {"k": "v"}


def test_a_hung_server_times_the_call_out(api: KubeEmulator) -> None:
    api.inject(Fault(status=None, delay=2.0, method="GET", path="/configmaps"))
    started = time.monotonic()
    with api_client(url=api.url, read_timeout=0.3) as client, pytest.raises(ReadTimeoutError):
        CoreV1Api(client).list_namespaced_config_map(NS)
    assert time.monotonic() - started < 1.5
