"""How many pods an in-place resize that restarts containers may take down at once
(``activities.owners.max_unavailable``): the workload's own rolling-update setting."""

from __future__ import annotations

from typing import Any

import pytest

from activities.owners import max_unavailable
from workflows.contract import WorkloadKind as K


def owner(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "w"}, "spec": spec}


def rolling(value: Any) -> dict[str, Any]:
    return {"rollingUpdate": {"maxUnavailable": value}}


def canary(value: Any) -> dict[str, Any]:
    return {"canary": {"maxUnavailable": value}}


@pytest.mark.parametrize(
    ("kind", "spec", "desired", "want"),
    [
        pytest.param(K.DEPLOYMENT, {}, 8, 2, id="deployment-25%"),
        pytest.param(K.DEPLOYMENT, {}, 3, 1, id="at-least-one"),
        pytest.param(K.DEPLOYMENT, {"strategy": rolling("50%")}, 6, 3, id="percent"),
        pytest.param(K.DEPLOYMENT, {"strategy": rolling(2)}, 6, 2, id="number"),
        pytest.param(K.DEPLOYMENT, {"strategy": rolling(0)}, 6, 1, id="zero-is-one"),
        pytest.param(K.STATEFUL_SET, {}, 6, 1, id="statefulset-default"),
        pytest.param(K.STATEFUL_SET, {"updateStrategy": rolling(3)}, 6, 3, id="statefulset"),
        pytest.param(K.DAEMON_SET, {"updateStrategy": rolling("20%")}, 10, 2, id="daemonset"),
        pytest.param(K.ROLLOUT, {"strategy": canary(1)}, 10, 1, id="rollout"),
        pytest.param(K.ROLLOUT, {"strategy": canary("x")}, 10, 1, id="unreadable"),
        pytest.param(K.STRIMZI_POD_SET, {}, 3, 1, id="other-kinds-one"),
    ],
)  # fmt: skip
def test_max_unavailable(kind: K, spec: dict[str, Any], desired: int, want: int) -> None:
    assert max_unavailable(kind, owner(**spec), desired) == want
