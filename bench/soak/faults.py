"""The soak's fault schedule, spread over the story's first minute or so: the emulator answering
about 10% of the engine's requests badly (5xx, 429, a timeout, 409 to patches, slow), every
watch stream cut now and then, each worker SIGKILLed in turn, the leading intake SIGKILLed
twice, the leader cut off its Lease for 20 s while work falls due, Temporal restarted, and the
engine's kill switch off for ``AUTOMATION_OFF`` seconds (``rightsizing.kubex.ai/automation``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from activities.kubetime import parse_kube_time
from bench.soak.supervisor import INTAKE_KUBE_TIMEOUT, KUBE_TIMEOUT, Child
from sim.apiserver import Fault, KubeEmulator
from sim.devserver import DevServer
from worker.config import INTAKE_AGENT
from workflows.contract import AUTOMATION_ANNOTATION, DEFAULT_ENGINE_NAMESPACE
from workflows.pause import DISABLED as AUTOMATION_DISABLED

MERGE = "application/merge-patch+json"

# Seconds into the Lease cut at which its work falls: while the cut-off leader still holds the
# Lease, past its renew deadline (10 s: it must have stopped acting), and after the Lease has
# expired (15 s) and the other intake has taken it, its elector still stuck in a renewal.
CUT_WORK = (1.0, 8.0, 11.0, 13.0, 17.0, 19.0)
AUTOMATION_OFF = 8.0  # seconds the kill switch is off: backoffs end and pods adopt meanwhile
SCHEDULE = {  # the fraction of the fault window at which each happens
    0.10: "api faults on",
    0.20: "kill worker-a",
    0.35: "kill leading intake",
    0.42: "cut the leader off its Lease",
    0.50: "restart temporal",
    0.58: "automation off",
    0.65: "kill worker-b",
    0.80: "kill leading intake",
    1.00: "api faults off",
}


class KillSwitch:
    """The engine's kill switch, which the fault schedule and a fate (``policy-deleted-off``)
    each switch off for a while: off while either holds it off."""

    def __init__(self, api: KubeEmulator) -> None:
        self.api, self.holders = api, 0

    def off(self) -> None:
        self.holders += 1
        if self.holders == 1:
            self._write(AUTOMATION_DISABLED)

    def on(self) -> None:
        self.holders -= 1
        if self.holders == 0:
            self._write(None)

    def _write(self, value: str | None) -> None:
        body = {"metadata": {"annotations": {AUTOMATION_ANNOTATION: value}}}
        store = self.api.store
        store.patch(store.rtype("Namespace"), None, DEFAULT_ENGINE_NAMESPACE, body, MERGE)


class FaultSchedule:
    """Injects the faults; ``due(share)`` is the script's, called as each share of the Lease
    cut's work (``shares``, one per ``CUT_WORK`` moment) falls due; ``faults`` counts them."""

    def __init__(
        self,
        api: KubeEmulator,
        children: dict[str, Child],
        temporal: DevServer | None,  # restarted as a fault (None: another cluster's to restart)
        shares: Sequence[Sequence[Any]],
        due: Callable[[Sequence[Any]], None],
        faults: Counter[str],
        switch: KillSwitch,
    ) -> None:
        self.api, self.children, self.temporal = api, children, temporal
        self.shares, self.due, self.faults, self.switch = shares, due, faults, switch
        self.api_faults: list[tuple[str, Fault]] = []

    async def run(self, length: float) -> None:
        """The schedule, spread over ``length`` seconds; the watch streams cut six times."""
        began, cuts = time.monotonic(), 0
        for fraction, what in sorted(SCHEDULE.items()):
            while time.monotonic() - began < fraction * length:
                await asyncio.sleep(0.5)
                if time.monotonic() - began > (cuts + 1) * length / 6:
                    cuts += 1
                    self.api.store.drop_watches()
                    self.faults["watch streams cut"] += 1
                for child in self.children.values():
                    child.sample_rss()
            await self._fault(what)

    def api_faults_on(self, on: bool) -> None:
        """About 10% of the engine's requests answered badly, 409 to patches, slow answers;
        off: this schedule's own faults removed (a burst or a partition ends by itself)."""
        if not on:
            mine = {id(fault) for _, fault in self.api_faults}
            with self.api._lock:
                self.api.faults[:] = [f for f in self.api.faults if id(f) not in mine]
            return
        for kind, fault in (
            ("503", Fault(status=503, times=None, probability=0.04)),
            ("500", Fault(status=500, times=None, probability=0.02)),
            ("429", Fault(status=429, times=None, probability=0.02)),
            ("timeout", Fault(status=None, times=None, probability=0.01, delay=KUBE_TIMEOUT + 1)),
            ("409 on patch", Fault(status=409, method="PATCH", times=None, probability=0.05)),
            ("slow", Fault(status=None, times=None, probability=0.03, delay=0.5)),
        ):
            self.api_faults.append((kind, fault))
            self.api.inject(fault)

    def injected(self) -> Counter[str]:
        """The faults by kind, the emulator's among them by how often each was hit."""
        hits = Counter({kind: fault.hits for kind, fault in self.api_faults if fault.hits})
        return self.faults + hits

    async def _leader(self) -> Child | None:
        """The intake that leads now: it holds the Lease and renewed it in the last 3 s (not a
        dead holder whose Lease has yet to expire); None when none does within 30 s."""
        store = self.api.store
        for _ in range(60):
            with contextlib.suppress(Exception):
                lease = store.get(store.rtype("Lease"), "default", "rightsizing-rollback-intake")
                spec = lease.get("spec") or {}
                renewed = parse_kube_time(spec.get("renewTime"))
                child = self.children.get(spec.get("holderIdentity") or "")
                fresh = renewed is not None and time.time() - renewed.timestamp() < 3
                if child is not None and fresh:
                    return child
            await asyncio.sleep(0.5)
        return None

    async def _fault(self, what: str) -> None:
        if what.startswith("api faults"):
            self.api_faults_on(what.endswith("on"))
        elif what.startswith("kill worker"):
            child = self.children[what.removeprefix("kill ")]
            child.kill()
            self.faults["worker SIGKILL"] += 1
            await asyncio.sleep(3)
            child.start()
        elif what == "kill leading intake":
            leader = await self._leader()
            if leader is not None:
                leader.kill()
                self.faults["leading intake SIGKILL"] += 1
                await asyncio.sleep(18)  # past the Lease (15 s): the other intake takes over
                leader.start()
        elif what == "cut the leader off its Lease":
            await self._cut()
        elif what == "automation off":
            self.switch.off()
            self.faults[f"automation off, the kill switch ({AUTOMATION_OFF:.0f}s)"] += 1
            await asyncio.sleep(AUTOMATION_OFF)
            self.switch.on()
        elif what == "restart temporal" and self.temporal is not None:
            await asyncio.to_thread(self.temporal.stop)
            self.faults["Temporal restart"] += 1
            await asyncio.sleep(3)
            await asyncio.to_thread(self.temporal.start)

    async def _cut(self) -> None:
        """Alive and able to write everything else, the leader cannot renew: its renewals hang,
        past the Lease's expiry (``INTAKE_KUBE_TIMEOUT``), so its elector cannot step down in
        time; the fence alone must keep it from acting once the other intake may lead."""
        leader = await self._leader()
        if leader is None:  # said, so a test can require the cut; its work is done anyway
            self.faults["Lease cut skipped: no leader"] += 1
            self.due([w for share in self.shares for w in share])
            return
        partition = self.api.inject(
            Fault(status=None, path="/leases/", times=None, delay=INTAKE_KUBE_TIMEOUT + 2,
                  agent=f"{INTAKE_AGENT}/{leader.name}")
        )  # fmt: skip
        self.faults["leader cut off its Lease (20s)"] += 1
        began = time.monotonic()
        for at, share in zip(CUT_WORK, self.shares, strict=True):  # each due at its moment
            await asyncio.sleep(max(0.0, at - (time.monotonic() - began)))
            self.due(share)
        await asyncio.sleep(20 - CUT_WORK[-1])
        with self.api._lock:
            self.api.faults.remove(partition)
