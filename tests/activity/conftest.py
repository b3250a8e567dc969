"""The Kubernetes API emulator over real HTTP, and the activities wired to it by the real client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi

from activities.kubernetes import KubernetesActivities
from sim.apiserver import KubeEmulator
from worker.kube import api_client
from workflows.contract import Actuation


@pytest.fixture
def api() -> Iterator[KubeEmulator]:
    with KubeEmulator() as emulator:
        yield emulator


@pytest.fixture
def client(api: KubeEmulator) -> Iterator[ApiClient]:
    with api_client(url=api.url) as kube:
        yield kube


@pytest.fixture
def acts(client: ApiClient) -> KubernetesActivities:
    return KubernetesActivities(
        CoreV1Api(client), CustomObjectsApi(client), Actuation.ANNOTATIONS, "test"
    )


@pytest.fixture
def in_place(client: ApiClient) -> KubernetesActivities:
    return KubernetesActivities(
        CoreV1Api(client), CustomObjectsApi(client), Actuation.IN_PLACE, "test"
    )
