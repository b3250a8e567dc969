"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go does it.

Exactly one intake drives workflows per cluster. A candidate takes the Lease when it does not
exist or its holder stopped renewing (``renewTime + leaseDurationSeconds`` has passed), renews it
every ``retry_period`` while leading, and steps down when it could not renew within
``renew_deadline``. Every write is a replace carrying the read ``resourceVersion``, so two
candidates racing for an expired Lease cannot both win.

Fencing: ``holds()`` is true only until ``renew_deadline`` after the start of the last successful
renewal, measured on this process's monotonic clock, whatever the election thread is doing (a
renewal stuck in a slow API call does not extend it). Another candidate can take the Lease only
``lease_duration`` after that renewal, so a leader that checks ``holds()`` right before each
write or signal has stopped acting, with ``lease_duration - renew_deadline`` to spare, before a
new leader can act.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from activities.kubetime import parse_kube_time

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "coordination.k8s.io", "v1", "leases"


def _micro(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        custom: CustomObjectsApi,
        namespace: str,
        name: str,
        identity: str,
        on_started: Callable[[], None],
        on_stopped: Callable[[], None],
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
    ) -> None:
        self.custom = custom
        self.namespace, self.name, self.identity = namespace, name, identity
        self.on_started, self.on_stopped = on_started, on_stopped
        self.lease_duration, self.renew_deadline, self.retry_period = (
            lease_duration,
            renew_deadline,
            retry_period,
        )
        self.leading = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_renew = 0.0  # monotonic start of the last successful acquire or renewal
        self.attempts = 0  # tries to acquire or renew, answered or not

    def start(self) -> LeaderElector:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()
        return self

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def holds(self) -> bool:
        """Whether this candidate may act as the leader now (the fence; see the module)."""
        return self.time_left() > 0

    def time_left(self) -> float:
        """Seconds the fence holds from now (0 when not leading): what an action that must
        finish within this term (a signal to Temporal) may take."""
        if not self.leading.is_set():
            return 0.0
        return max(0.0, self._last_renew + self.renew_deadline - time.monotonic())

    def stop(self, release: bool = True) -> None:
        """Stop campaigning; a leader steps down (and releases the Lease unless told not to)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self.leading.is_set():
            self._step_down()
            if release:
                self._release()

    def _run(self) -> None:
        while not self._stop.is_set():
            attempt = time.monotonic()  # the renewTime written is no earlier than this
            try:
                acquired = self._try_acquire_or_renew()
            except Exception as exc:  # a timeout, a 500...: the campaign must outlive any failure
                log.warning("leader election: %s", str(exc).splitlines()[0])
                acquired = False
            self.attempts += 1
            now = time.monotonic()
            if acquired:
                self._last_renew = attempt
                if not self.leading.is_set():
                    log.info("leader election: %s is now the leader", self.identity)
                    self.leading.set()
                    self.on_started()
            elif self.leading.is_set() and now - self._last_renew > self.renew_deadline:
                log.warning(
                    "leader election: could not renew within %ss, stepping down",
                    self.renew_deadline,
                )
                self._step_down()
            self._stop.wait(self.retry_period)

    def _step_down(self) -> None:
        self.leading.clear()
        self.on_stopped()

    def _spec(self, now: datetime, acquired: datetime, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration),
            "acquireTime": _micro(acquired),
            "renewTime": _micro(now),
            "leaseTransitions": transitions,
        }

    def _try_acquire_or_renew(self) -> bool:
        now = datetime.now(UTC)
        try:
            lease: Any = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, now, 0),
            }
            try:
                self.custom.create_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, body
                )
                return True
            except ApiException as create_exc:
                if create_exc.status == 409:
                    return False
                raise
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = parse_kube_time(spec.get("renewTime"))
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        expired = renewed is None or (now - renewed).total_seconds() > duration
        if holder not in (None, "", self.identity) and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        acquired = parse_kube_time(spec.get("acquireTime")) if holder == self.identity else now
        lease["spec"] = self._spec(now, acquired or now, transitions)
        try:
            self.custom.replace_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name, lease
            )
        except ApiException as exc:
            if exc.status == 409:  # someone else wrote it first
                return False
            raise
        return True

    def _release(self) -> None:
        try:
            lease: Any = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name
            )
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                lease["spec"]["renewTime"] = None
                self.custom.replace_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, self.name, lease
                )
        except (ApiException, HTTPError, OSError) as exc:
            log.info("leader election: release failed (%s); the Lease expires by itself", exc)
