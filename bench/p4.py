"""P4: policy resolution for W workloads x P policies: the intake's index vs a linear scan."""

from __future__ import annotations

import random
import time

from bench.harness import (
    Lines,
    say,
)
from workflows.contract import WorkloadKind
from workflows.policy import ClusterRollbackPolicy, RollbackPolicy
from workflows.selection import PolicyIndex, WorkloadRef, resolve


def policy_resolution(workloads: int, policies: int, lines: Lines) -> None:
    rng = random.Random(7)
    namespaces = [f"team-{i}" for i in range(100)] + [f"prod-{i}" for i in range(50)]
    docs: list[RollbackPolicy | ClusterRollbackPolicy] = []
    spec = {
        "monitoringPeriod": "5m",
        "rollbackTarget": "manifest",
        "adoptionThresholdPercent": 80,
        "backoff": {"timePeriod": "1m", "multiplyByTurn": 2, "maxAttempts": 3},
    }
    for i in range(policies):
        selector = {"matchLabels": {"tier": rng.choice(["api", "worker", "db"])}}
        if i % 10 == 0:
            docs.append(
                ClusterRollbackPolicy.model_validate(
                    {
                        "kind": "ClusterRollbackPolicy",
                        "metadata": {"name": f"c{i}"},
                        "spec": {
                            **spec,
                            "weight": rng.randint(0, 100),
                            "scope": {
                                "labelSelector": selector,
                                "namespaceSelector": {
                                    "operator": "In",
                                    "values": [f"prod-{rng.randint(0, 49)}*"],
                                },
                            },
                        },
                    }
                )
            )
        else:
            docs.append(
                RollbackPolicy.model_validate(
                    {
                        "kind": "RollbackPolicy",
                        "metadata": {"name": f"p{i}", "namespace": rng.choice(namespaces)},
                        "spec": {
                            **spec,
                            "weight": rng.randint(0, 100),
                            "scope": {"labelSelector": selector},
                        },
                    }
                )
            )
    refs = [
        WorkloadRef(
            WorkloadKind.DEPLOYMENT,
            rng.choice(namespaces),
            f"w{i}",
            {"tier": rng.choice(["api", "worker", "db"])},
        )
        for i in range(workloads)
    ]
    began = time.monotonic()
    index = PolicyIndex()
    for doc in docs:
        index.upsert(doc)
    indexed = [index.resolve(w).policy for w in refs]
    index_time = time.monotonic() - began
    began = time.monotonic()
    linear = [resolve(docs, w).policy for w in refs]
    linear_time = time.monotonic() - began
    assert indexed == linear, "the index and the linear scan disagree"
    say(
        lines,
        f"  {workloads} workloads x {policies} policies: index {index_time:.2f}s"
        f" ({index_time / workloads * 1e6:.0f} us/workload, build included), linear"
        f" {linear_time:.2f}s ({linear_time / workloads * 1e6:.0f} us/workload): {linear_time / index_time:.0f}x,"
        " same answers",
    )
