"""Connecting to Temporal, and the client-side calls every process shares.

Connection settings come from flags or the standard Temporal environment variables
(``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS``,
``TEMPORAL_TLS_CLIENT_CERT_PATH``, ``TEMPORAL_TLS_CLIENT_KEY_PATH``,
``TEMPORAL_TLS_SERVER_CA_CERT_PATH``, ``TEMPORAL_TLS_SERVER_NAME``) plus ``ROLLBACK_TASK_QUEUE``.
Every client uses the pydantic data converter, as the workflow's models require.

``observe``/``reopen`` use signal-with-start: signalling an owner whose workflow has finished
starts its next run (the next turn, a reopen, a new recommendation) under the same ID.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from temporalio.client import Client, TLSConfig, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime

from workflows.activity_api import OwnerRef
from workflows.contract import TASK_QUEUE
from workflows.fingerprint import Recommendation
from workflows.machine import DEFAULT_SAMPLE_INTERVAL, Trigger
from workflows.rollback import (
    ObserveSignal,
    ReopenSignal,
    RollbackInput,
    RollbackResult,
    RollbackWorkflow,
)

log = logging.getLogger(__name__)

CONNECT_PATIENCE_SECONDS = 300.0


@dataclass(frozen=True)
class TemporalConfig:
    address: str = "localhost:7233"
    namespace: str = "default"
    task_queue: str = TASK_QUEUE
    api_key: str | None = None
    tls: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_server_name: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> TemporalConfig:
        return cls(
            address=env.get("TEMPORAL_ADDRESS", cls.address),
            namespace=env.get("TEMPORAL_NAMESPACE", cls.namespace),
            task_queue=env.get("ROLLBACK_TASK_QUEUE", cls.task_queue),
            api_key=env.get("TEMPORAL_API_KEY") or None,
            tls=env.get("TEMPORAL_TLS", "").lower() in ("1", "true", "yes"),
            tls_cert=env.get("TEMPORAL_TLS_CLIENT_CERT_PATH") or None,
            tls_key=env.get("TEMPORAL_TLS_CLIENT_KEY_PATH") or None,
            tls_ca=env.get("TEMPORAL_TLS_SERVER_CA_CERT_PATH") or None,
            tls_server_name=env.get("TEMPORAL_TLS_SERVER_NAME") or None,
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TemporalConfig:
        base = cls.from_env()
        return cls(
            address=args.address or base.address,
            namespace=args.namespace or base.namespace,
            task_queue=args.task_queue or base.task_queue,
            api_key=args.api_key or base.api_key,
            tls=args.tls or base.tls,
            tls_cert=args.tls_cert or base.tls_cert,
            tls_key=args.tls_key or base.tls_key,
            tls_ca=args.tls_ca or base.tls_ca,
            tls_server_name=base.tls_server_name,
        )

    def tls_config(self) -> TLSConfig | bool:
        """mTLS when a client certificate is given; plain TLS for an API key or ``--tls``."""
        if self.tls_cert or self.tls_key or self.tls_ca:
            if bool(self.tls_cert) != bool(self.tls_key):
                raise ValueError("--tls-cert and --tls-key must be given together")
            return TLSConfig(
                client_cert=Path(self.tls_cert).read_bytes() if self.tls_cert else None,
                client_private_key=Path(self.tls_key).read_bytes() if self.tls_key else None,
                server_root_ca_cert=Path(self.tls_ca).read_bytes() if self.tls_ca else None,
                domain=self.tls_server_name,
            )
        return self.tls or bool(self.api_key)

    async def connect(self, runtime: Runtime | None = None) -> Client:
        return await Client.connect(
            self.address,
            namespace=self.namespace,
            api_key=self.api_key,
            tls=self.tls_config(),
            data_converter=pydantic_data_converter,
            runtime=runtime,
        )

    async def connect_patiently(
        self, runtime: Runtime | None = None, within: float = CONNECT_PATIENCE_SECONDS
    ) -> Client:
        """``connect``, retried with backoff for ``within`` seconds: a worker or intake that
        starts while the Temporal frontend restarts waits for it instead of crash-looping."""
        deadline, delay = time.monotonic() + within, 0.5
        while True:
            try:
                return await self.connect(runtime)
            except RuntimeError as exc:  # the SDK's "Failed client connect: ..."
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("Temporal at %s: %s; retrying in %.1fs", self.address, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Temporal connection (flags override environment)")
    group.add_argument("--address", help="host:port (TEMPORAL_ADDRESS, default localhost:7233)")
    group.add_argument("--namespace", help="Temporal namespace (TEMPORAL_NAMESPACE)")
    group.add_argument(
        "--task-queue", help=f"task queue (ROLLBACK_TASK_QUEUE, default {TASK_QUEUE})"
    )
    group.add_argument("--api-key", help="API key, e.g. Temporal Cloud (TEMPORAL_API_KEY)")
    group.add_argument("--tls", action="store_true", help="use TLS without a client cert")
    group.add_argument(
        "--tls-cert", help="client certificate for mTLS (TEMPORAL_TLS_CLIENT_CERT_PATH)"
    )
    group.add_argument("--tls-key", help="client key for mTLS (TEMPORAL_TLS_CLIENT_KEY_PATH)")
    group.add_argument("--tls-ca", help="server CA certificate (TEMPORAL_TLS_SERVER_CA_CERT_PATH)")


async def observe(
    client: Client,
    task_queue: str,
    owner: OwnerRef,
    recommendation: Recommendation,
    *,
    pod: str | None = None,
    pod_created_at: datetime | None = None,
    trigger: Trigger = Trigger.OBSERVE,
    sample_interval: timedelta = DEFAULT_SAMPLE_INTERVAL,
) -> WorkflowHandle[RollbackWorkflow, RollbackResult]:
    """Signal-with-start ``observe`` (or ``reopen``) on the owner's workflow."""
    start = RollbackInput(
        owner=owner,
        recommendation=recommendation,
        trigger=trigger,
        observed_pod_created_at=pod_created_at,
        sample_interval=sample_interval,
    )
    signal_arg: ReopenSignal | ObserveSignal
    if trigger is Trigger.REOPEN:
        signal, signal_arg = "reopen", ReopenSignal()
    else:
        signal = "observe"
        signal_arg = ObserveSignal(
            recommendation=recommendation, pod=pod, pod_created_at=pod_created_at
        )
    return await client.start_workflow(
        RollbackWorkflow.run,
        start,
        id=owner.workflow_id,
        task_queue=task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal=signal,
        start_signal_args=[signal_arg],
        static_summary=f"Rollback monitoring of {owner}",
    )
