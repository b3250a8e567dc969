"""The chaos soak in CI (``bench.soak``): two clusters of 100 workloads on one Temporal, many
faults at once on each cluster's two workers and two leader-electing intakes, and an oracle that
knows each workload's end. Every invariant must be 0. The oracle's own checks are tested on
journals made by hand."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.api.history.v1 import HistoryEvent

from bench.soak import (
    FATES,
    INVARIANTS,
    PROTECTED_NS,
    Evidence,
    Timeline,
    Workload,
    invariants,
    plan,
    report,
    soak_fleet,
)
from sim.apiserver import RESOURCE_TYPES, Request, Store
from tests.conftest import ROOT
from worker.config import INTAKE_AGENT, WORKER_AGENT
from workflows.contract import (
    ROLLBACK_LIMITS_ANNOTATION,
    ROLLBACK_REQUESTS_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
    Obj,
)


def evidence(**seen: Any) -> Evidence:
    """What a story left, as the oracle reads it: nothing but ``seen``."""
    empty = {"cluster": "c", "queue": "q", "workloads": [], "timeline": Timeline(), "journal": [],
             "store": Store(RESOURCE_TYPES), "received": [], "worker_logs": []}  # fmt: skip
    return Evidence(**(empty | seen))


def worker_request(method: str, path: str, at: float) -> Request:
    """A worker's request the API server took, as the emulator journals it."""
    return Request(method, path, {}, "", 200, f"{WORKER_AGENT}/1.0", at)


def more_unavailable(timeline: Timeline, journal: list[Request]) -> tuple[list[str], int]:
    """``invariants.more_unavailable`` over a hand-made timeline and journal: what it reports,
    and how many take-downs it checked."""
    found: list[str] = []
    ev = evidence(timeline=timeline, journal=journal)
    checked = invariants.more_unavailable(ev, lambda kind, what: found.append(f"{kind}: {what}"))
    return found, checked


def found_by(check: Any, *args: Any) -> list[str]:
    """The breaches ``check`` (an invariant of ``bench.soak.invariants``) reports, as lines."""
    found: list[str] = []
    check(*args, lambda kind, what: found.append(f"{kind}: {what}"))
    return found


def test_the_oracle_sees_a_write_from_an_intake_that_does_not_lead() -> None:
    timeline = Timeline()
    now = time.time()
    timeline.holders = [(now - 10, "intake-a"), (now - 5, "intake-b")]
    assert timeline.holder_at(now - 7) == "intake-a" and timeline.holder_at(now) == "intake-b"
    ev = evidence(timeline=timeline, journal=[
        Request("PATCH", "/apis/apps/v1/namespaces/x/deployments/a", {}, "", 200,
                f"{INTAKE_AGENT}/intake-a", now - 7),  # while it led: fine
        Request("PATCH", "/apis/apps/v1/namespaces/x/deployments/a", {}, "", 200,
                f"{INTAKE_AGENT}/intake-a", now - 1),  # after the Lease moved on: a violation
        Request("PUT", "/apis/coordination.k8s.io/v1/namespaces/default/leases/l", {}, "", 200,
                f"{INTAKE_AGENT}/intake-a", now - 1),  # campaigning: fine
    ])  # fmt: skip
    found = found_by(invariants.non_leader_writes, ev)
    assert len(found) == 1 and found[0].startswith("nonLeaderWrites: intake-a PATCH")


def test_the_oracle_sees_any_acting_write_while_paused() -> None:
    """``actedWhilePaused`` counts every worker write that changes what runs while the pause
    holds, from the journal: a rollback annotation published or cleared, a pod resized; not a
    state record, not a write before or after the pause or already past its gate as the pause
    was set (``GATE_GRACE``), not another client's. Paused right after a step's read
    (``paused-at-gate``), a write that soon after is a breach: it had its gate to read again."""
    timeline = Timeline()
    now = time.time()
    calm, early, late = (
        Workload(i, FATES[0], "ns", name, "Deployment", "RollbackPolicy")
        for i, name in enumerate(("calm", "early", "late"))
    )
    gate = next(f for f in FATES if f.paused_in == "gate")
    at_gate = Workload(3, gate, "ns", "gate", "Deployment", "RollbackPolicy")
    for w in (calm, early, late, at_gate):
        w.paused = (now - 10, now)
    timeline.pods = {early.ref: {"early-0": [(now - 20, True)]}}
    worker = f"{WORKER_AGENT}/1.0"
    journal = [
        Request("PATCH", "/apis/apps/v1/namespaces/ns/deployments/early", {}, "", 200, worker,
                now - 3, {ROLLBACK_REQUESTS_ANNOTATION: "{}"}),  # published in the pause
        Request("PATCH", "/apis/apps/v1/namespaces/ns/deployments/early", {}, "", 200, worker,
                now - 2, {ROLLBACK_LIMITS_ANNOTATION: None, ROLLBACK_STATE_ANNOTATION: None}),
        # cleared
        Request("PATCH", "/api/v1/namespaces/ns/pods/early-0/resize", {}, "", 200, worker,
                now - 1),  # resized in the pause
        Request("PATCH", "/apis/apps/v1/namespaces/ns/deployments/calm", {}, "", 200, worker,
                now - 3, {ROLLBACK_STATE_ANNOTATION: "{}"}),  # its state only: fine
        Request("PATCH", "/apis/apps/v1/namespaces/ns/deployments/calm", {}, "", 200, "kubectl",
                now - 3, {ROLLBACK_REQUESTS_ANNOTATION: "{}"}),  # not the engine: fine
        Request("PATCH", "/apis/apps/v1/namespaces/ns/deployments/late", {}, "", 200, worker,
                now + 1, {ROLLBACK_REQUESTS_ANNOTATION: "{}"}),  # after the pause: fine
        Request("PATCH", "/apis/apps/v1/namespaces/ns/deployments/late", {}, "", 200, worker,
                now - 9.5, {ROLLBACK_REQUESTS_ANNOTATION: "{}"}),  # past its gate as set: fine
        Request("PATCH", "/apis/apps/v1/namespaces/ns/deployments/gate", {}, "", 200, worker,
                now - 9.9, {ROLLBACK_REQUESTS_ANNOTATION: None}),  # after the read: a breach
    ]  # fmt: skip
    ev = evidence(timeline=timeline, workloads=[calm, early, late, at_gate], journal=journal)
    assert found_by(invariants.acted_while_paused, ev) == [
        "actedWhilePaused: ns/Deployment/early: rollback annotation written (published or"
        " cleared) 3.0s before its pause ended",
        "actedWhilePaused: ns/Deployment/early: rollback annotation written (published or"
        " cleared) 2.0s before its pause ended",
        "actedWhilePaused: ns/Deployment/early: pod early-0 resized 1.0s before its pause ended",
        "actedWhilePaused: ns/Deployment/gate: rollback annotation written (published or"
        " cleared) 9.9s before its pause ended",
    ]


def test_the_oracle_sees_more_pods_down_than_allowed() -> None:
    """``moreUnavailable`` counts, as each pod a worker's resize took down goes down, the owner's
    pods not Ready then (the engine's, and those down of their own since the batch's LIST could
    see them) against the tighter of maxUnavailable and the disruption budget: a rollback's or a
    re-apply's alike. Not a pod already down when resized, not one that fell just after the
    LIST, and a pod resized twice (a retry whose first answer was lost) down once."""
    timeline = Timeline()
    t = time.time() - 100
    up, down = True, False
    timeline.pods = {
        "ns/Deployment/at-once": {  # both resized at t+11: down together
            "a-0": [(t, up), (t + 11.2, down), (t + 12, up)],
            "a-1": [(t, up), (t + 11.3, down), (t + 12, up)],
        },
        "ns/Deployment/paced": {  # one, Ready again, then the next (a re-apply, at t+50)
            "b-0": [(t, up), (t + 51.2, down), (t + 52, up)],
            "b-1": [(t, up), (t + 53.2, down), (t + 54, up)],
        },
        "ns/Deployment/crashing": {  # c-1 down (OOM) since t+5 when c-0 was taken down
            "c-0": [(t, up), (t + 11.2, down), (t + 12, up)],
            "c-1": [(t, up), (t + 5, down), (t + 11.5, up)],
        },
        "ns/Deployment/fell": {  # e-1 resized while down; e-2 fell on its own after the LIST
            "e-0": [(t, up), (t + 11.2, down), (t + 12, up)],
            "e-1": [(t, up), (t + 10.9, down), (t + 11.5, up)],
            "e-2": [(t, up), (t + 11.1, down), (t + 12, up)],
        },
        "ns/Deployment/retried": {  # d-0 resized twice before it went down: then d-1
            "d-0": [(t, up), (t + 11.5, down), (t + 12, up)],
            "d-1": [(t, up), (t + 13.2, down), (t + 14, up)],
        },
        "ns/Deployment/budget": {  # its budget allowed none until t+20, then one
            "f-0": [(t, up), (t + 15.2, down), (t + 16, up)],
            "f-1": [(t, up), (t + 21.2, down), (t + 22, up)],
        },
    }
    timeline.budgets = {"ns/Deployment/budget": [(t + 1, 0), (t + 20, 1)]}
    resizes = [("a-0", 11), ("a-1", 11), ("b-0", 51), ("b-1", 53), ("c-0", 11), ("c-1", 11),
               ("e-0", 11), ("e-1", 11), ("d-0", 11), ("d-0", 11.3), ("d-1", 13), ("f-0", 15),
               ("f-1", 21)]  # fmt: skip

    journal = [worker_request("PATCH", f"/api/v1/namespaces/ns/pods/{pod}/resize", t + at)
               for pod, at in resizes]  # fmt: skip
    found, checked = more_unavailable(timeline, journal)
    assert found == [
        "moreUnavailable: ns/Deployment/at-once: a-1 taken down at +0.3s after its resize with"
        " ['a-0'] not Ready: 1 allowed",
        "moreUnavailable: ns/Deployment/crashing: c-0 taken down at +0.2s after its resize with"
        " ['c-1'] not Ready: 1 allowed",
        "moreUnavailable: ns/Deployment/budget: f-0 taken down at +0.2s after its resize with"
        " [] not Ready: 0 allowed (its budget's maxUnavailable 0)",
    ]
    assert checked == 10  # all but c-1 and e-1, down when resized


def test_the_oracle_counts_a_restore_s_deletes_as_pods_taken_down() -> None:
    """A pod a restore deletes for its controller to recreate is down from its delete until a
    replacement is Ready (a new name, or a StatefulSet's same one): two Ready pods deleted at
    once break maxUnavailable 1; one after the other's replacement is Ready does not; a pod
    already down (crash-looping) when deleted takes nothing down."""
    timeline = Timeline()
    t = time.time() - 100
    up, down, gone = True, False, None
    timeline.pods = {
        "ns/Deployment/paced": {  # g-0 replaced by g-8, then g-1 by g-9
            "g-0": [(t, up), (t + 30.1, gone)],
            "g-8": [(t + 30.3, down), (t + 31, up)],
            "g-1": [(t, up), (t + 32.1, gone)],
            "g-9": [(t + 32.3, down), (t + 33, up)],
        },
        "ns/StatefulSet/together": {  # both at once, each recreated under its own name
            "h-0": [(t, up), (t + 40.1, gone), (t + 40.4, down), (t + 41, up)],
            "h-1": [(t, up), (t + 40.2, gone), (t + 40.5, down), (t + 41, up)],
        },
        "ns/Deployment/looping": {"i-0": [(t, up), (t + 5, down), (t + 50.1, gone)]},
    }
    deletes = [("g-0", 30), ("g-1", 32), ("h-0", 40), ("h-1", 40), ("i-0", 50)]
    journal = [worker_request("DELETE", f"/api/v1/namespaces/ns/pods/{pod}", t + at)
               for pod, at in deletes]  # fmt: skip
    found, checked = more_unavailable(timeline, journal)
    assert found == [
        "moreUnavailable: ns/StatefulSet/together: h-1 taken down at +0.2s after its delete"
        " with ['h-0'] not Ready: 1 allowed",
    ]
    assert checked == 4  # all but i-0, down when deleted


async def test_the_soak_reports_zero_on_every_invariant_in_two_clusters() -> None:
    """A fleet: two clusters with the same workload names, each with its workers and intakes,
    on one Temporal (restarted mid-story), under the same faults: each cluster's oracle is 0,
    and no run crosses clusters. 100 workloads each: every fate on both owner kinds under both
    policy kinds. The second actuates in place, its containers restarting to resize: its
    rollbacks never take more pods down than maxUnavailable."""
    # The deadline bounds a hang; the soak ends once every workload settled (about 140 s alone,
    # 185 s beside the stories' lane of `make test`).
    results = await soak_fleet(100, clusters=2, deadline=420.0)
    lines = "\n".join(line for r in results for line in report(r))
    assert [r.cluster for r in results] == ["soak-0", "soak-1"]
    for result in results:
        assert result.settled, lines
        assert result.invariants["crossedClusters"] == 0, lines
        assert result.invariants and all(n == 0 for n in result.invariants.values()), lines
        # It was a soak: the faults happened, and the story ran to its known ends.
        for kind in ("worker SIGKILL", "leading intake SIGKILL", "503", "429"):
            assert result.faults[kind] > 0, lines
        assert result.faults["owner paused through its verdict"] > 0, lines
        assert result.faults["owner paused through its backoff's end"] > 0, lines
        assert result.outcomes["failedPermanent"] and result.outcomes["cancelled"], lines
        # The Lease cut happened, with work inside it, and leadership changed hands.
        assert result.faults["leader cut off its Lease (20s)"] == 1, lines
        assert result.faults["workloads applied inside the Lease cut"] > 0, lines
        assert result.faults["cancels annotated inside the Lease cut"] > 0, lines
        assert result.leaders >= 2, lines
        # The verdicts under a 503 burst went on as regular activities.
        assert result.faults["local activities gone on as regular ones (fallback)"] > 0, lines
    assert results[0].faults["Temporal restart"] == 1, lines  # shared: the other saw it too
    for result in results:  # the neighbours: a peak under an HPA, a bad release in a window
        assert result.faults["a peak under an HPA through a CPU cut's window"] > 0, lines
        assert result.faults["a bad release shipped in a cut's window"] > 0, lines
        assert result.faults["a good release shipped in an OOM cut's window"] > 0, lines
    for result in results:  # each cluster's kill switch went off for a while
        assert result.faults["automation off, the kill switch (8s)"] == 1, lines
        # and for a deleted policy's clear, held; an owner paused between a read and a write
        assert result.faults["a deleted policy's clear held by the kill switch (RollbackPaused)"]
        assert result.faults["owner paused between a step's read and its write"] > 0, lines
    for result in results:  # each cluster's storm breaker tripped, held, told, and was reset
        assert result.faults["storm breaker tripped, reset by the operator"] > 0, lines
        assert result.faults["backoffs' ends the storm breaker held (RollbackPaused)"] > 0, lines
        assert result.faults["policies told the storm breaker tripped (their Event)"] > 0, lines
    assert "moreUnavailable" not in results[0].invariants, lines
    assert results[1].invariants["moreUnavailable"] == 0, lines
    taken = "pods taken down by the engine's in-place resizes (checked)"
    assert results[1].faults[taken] > 0, lines
    # It had work: a budget that held a rollback, a pause mid-rollback.
    assert results[1].faults["disruption budget allowing nothing through a rollback"] > 0, lines
    assert results[1].faults["owner paused mid-rollback, in place"] > 0, lines
    # Its restores recreated the pods they could not resize (crash-looping), gated as resizes.
    assert results[1].faults["pods a restore recreated (not Ready: CrashLoopBackOff, no room)"]


async def test_the_oracle_sees_a_crossed_run(tmp_path: Path) -> None:
    """``crossedClusters`` fires on a worker that refused another cluster's run."""
    log = tmp_path / "worker-a.log"
    log.write_text("ERROR ... ApplicationError: ForeignClusterError: refused load_owner of ...")

    class NoRuns:
        async def list_workflows(self, query: str):  # type: ignore[no-untyped-def]
            for _ in ():
                yield _

    found: list[str] = []
    ev = evidence(cluster="soak-0", queue="soak-soak-0", worker_logs=[log])
    await invariants.crossed_clusters(ev, NoRuns(), lambda kind, what: found.append(kind))
    assert found == ["crossedClusters"]


def test_the_oracle_sees_a_write_into_a_protected_namespace() -> None:
    now = time.time()
    journal = [
        Request("PATCH", f"/apis/apps/v1/namespaces/{PROTECTED_NS}/deployments/a", {}, "", 200,
                f"{WORKER_AGENT}/1.0", now),  # the engine: a violation
        Request("PATCH", f"/api/v1/namespaces/{PROTECTED_NS}/pods/a-0", {}, "", 200,
                "kubelet", now),  # the cluster itself: fine
        Request("GET", f"/apis/apps/v1/namespaces/{PROTECTED_NS}/deployments/a", {}, "", 200,
                f"{INTAKE_AGENT}/intake-a", now),  # a read: fine
        Request("POST", "/api/v1/namespaces/soak-00/events", {}, "", 201,
                f"{INTAKE_AGENT}/intake-a", now),  # elsewhere: fine
        Request("PATCH", f"/apis/rightsizing.kubex.ai/v1alpha1/namespaces/{PROTECTED_NS}"
                "/rollbackpolicies/p/status", {}, "", 200, f"{INTAKE_AGENT}/intake-a", now),
        # our policy's status, saying the namespace is protected: fine
    ]  # fmt: skip
    assert found_by(invariants.acted_in_protected, evidence(journal=journal)) == [
        f"actedInProtected: {WORKER_AGENT}/1.0 PATCH /apis/apps/v1/namespaces/{PROTECTED_NS}"
        "/deployments/a"
    ]


@pytest.mark.parametrize(
    ("hold", "check", "said"),
    [
        ("automation", invariants.reapplied_while_off, "reappliedWhileOff: ns/Deployment/{}: its"
         " cut brought back ({}) {}s into the kill switch's off"),
        ("breaker", invariants.reapplied_while_tripped, "reappliedWhileTripped: ns/Deployment/{}:"
         " its cut brought back ({}) {}s into the storm breaker's trip"),
    ],
)  # fmt: skip
def test_the_oracle_sees_a_cut_brought_back_while_a_cluster_hold_held(
    hold: str, check: Any, said: str
) -> None:
    """``reappliedWhileOff`` (the kill switch), ``reappliedWhileTripped`` (the storm breaker): a
    worker's PATCH sent past the gate's grace into the hold that lets a cut run again (a
    backoff's end, a clear for a policy gone, a retry over failedPermanent). No breach: one sent
    at its start (already past its gate) though served late, one after it, a last turn's end
    (failedPermanent keeps it off), a record that clears nothing published, another client's
    write; nor any under the other hold."""
    timeline = Timeline()
    setattr(timeline, hold, [(100.0, True), (110.0, False)])

    def patch(
        name: str,
        at: float,
        mode: str | None = "",
        published: bool | None = None,
        agent: str = f"{WORKER_AGENT}/1.0",
    ) -> Request:
        annotations: dict[str, str | None] = {}
        if mode != "":
            annotations[ROLLBACK_STATE_ANNOTATION] = json.dumps({"mode": mode}) if mode else None
        if published is not None:
            annotations[ROLLBACK_REQUESTS_ANNOTATION] = "{}" if published else None
        path = f"/apis/apps/v1/namespaces/ns/deployments/{name}"
        return Request("PATCH", path, {}, "", 200, agent, at, annotations)

    journal = [
        patch("a", 98.0, "backingOff", published=True),
        patch("a", 104.0, "backedOff", published=False),  # 4 s into it: a breach
        patch("a", 104.5, "backedOff"),  # nothing published any more: nothing brought back
        patch("b", 98.0, "backingOff", published=True),
        patch("b", 100.5, "backedOff", published=False),  # past its gate as it went off
        patch("c", 105.0, "backingOff", published=True),
        patch("c", 111.0, "backedOff", published=False),  # after it
        patch("d", 98.0, "backingOff", published=True),
        patch("d", 105.0, "failedPermanent", published=False),  # kept off
        patch("e", 98.0, "backingOff", published=True),
        patch("e", 104.0, None, published=False, agent="kubectl"),  # not the engine
        patch("f", 98.0, "backingOff", published=True),
        patch("f", 106.0, None, published=False),  # a policy gone: cleared 6 s into it
        patch("g", 97.0, "failedPermanent"),
        patch("g", 103.0, "monitoring"),  # a retry over failedPermanent 3 s into it
    ]  # fmt: skip
    assert found_by(check, evidence(timeline=timeline, journal=journal)) == [
        said.format("a", "backedOff", "4.0"), said.format("f", None, "6.0"),
        said.format("g", "monitoring", "3.0"),
    ]  # fmt: skip
    other = invariants.reapplied_while_tripped if hold == "automation" else (
        invariants.reapplied_while_off
    )  # fmt: skip
    assert found_by(other, evidence(timeline=timeline, journal=journal)) == []
    since = timeline.off_since if hold == "automation" else timeline.tripped_since
    assert since(104.0) == 100.0 and since(110.5) is None


def test_the_oracle_sees_lost_and_stuck_attempts_and_wrong_ends() -> None:
    """``lostOrStuck`` from Temporal's runs (closed ones too) against the fates and the owners'
    final states; ``wrongEnd`` from the script's known end."""
    fates = {f.name: f for f in FATES}
    names = ["healthy", "healthy", "oom", "oom", "reopen", "protected", "healthy"]
    ws = [Workload(i, fates[n], "ns", f"{n}-{i}", "Deployment", "RollbackPolicy")
          for i, n in enumerate(names)]  # fmt: skip
    runs = {
        ws[0].ref: {"COMPLETED"},  # ended as scripted
        ws[2].ref: {"COMPLETED", "RUNNING"},  # should have ended
        ws[3].ref: {"COMPLETED"},  # its owner says backingOff: nothing will take it on
        ws[4].ref: {"COMPLETED"},  # reopened: should be running
        ws[6].ref: {"COMPLETED"},
    }  # ws[1]: never started; ws[5]: protected, no run, as it should be
    ev = evidence(workloads=ws)
    backing_off = {"mode": "backingOff", "turn": 1}
    ev.store.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
        "name": ws[3].name, "namespace": "ns",
        "annotations": {ROLLBACK_STATE_ANNOTATION: json.dumps(backing_off)}}})  # fmt: skip
    runs = {f"rollback/c/{ref}": statuses for ref, statuses in runs.items()}
    wrong = lambda w: "('aborted', 1, None), expected ..." if w is ws[6] else None  # noqa: E731
    found: list[str] = []
    invariants.ends(ev, lambda kind, what: found.append(f"{kind}: {what}"), runs, wrong)
    assert found == [
        "lostOrStuck: ns/Deployment/healthy-1 (healthy): never started",
        "lostOrStuck: ns/Deployment/oom-2 (oom): still running",
        "lostOrStuck: ns/Deployment/oom-3 (oom): left backingOff with no run to go on",
        "lostOrStuck: ns/Deployment/reopen-4 (reopen): not running",
        "wrongEnd: ns/Deployment/healthy-6 (healthy): ('aborted', 1, None), expected ...;"
        " actions []",
    ]


def test_the_oracle_sees_a_rollback_entered_or_published_twice() -> None:
    timeline = Timeline()
    t = time.time() - 100
    back, off = {"mode": "rollingBack", "turn": 1}, {"mode": "backingOff", "turn": 1}
    timeline.states = {  # recorded twice in a row (a record done again after a crash): fine
        "ns/Deployment/ok": [(t, back), (t + 0.5, back | {"at": 2}), (t + 1, off)],
        "ns/Deployment/entered-twice": [(t, back), (t + 1, off), (t + 2, back)],
    }
    timeline.rollbacks = {
        "ns/Deployment/ok": [(t, "rollingBack", 1), (t + 5, "rollingBack", 2)],
        "ns/Deployment/doubled": [(t, "rollingBack", 1), (t + 1, "rollingBack", 1)],
        "ns/Deployment/again": [(t, "rollingBack", 1), (t + 5, "monitoring", 2)],
    }
    assert found_by(invariants.double_rollback, evidence(timeline=timeline)) == [
        "doubleRollback: ns/Deployment/entered-twice: rollingBack 2 times in turn 1",
        "doubleRollback: ns/Deployment/doubled: a rollback published 2 times in turn 1",
        "doubleRollback: ns/Deployment/again: a rollback published in monitoring turn 2",
    ]


def test_the_oracle_sees_a_transition_not_notified_or_notified_twice() -> None:
    timeline = Timeline()
    t = time.time() - 100
    timeline.states = {
        ref: [(t, {"mode": "rollingBack", "turn": 1})]
        for ref in ("ns/Deployment/ok", "ns/Deployment/missed", "ns/Deployment/twice")
    }

    def sent(name: str, key: str, cluster: str = "c") -> tuple[str, Obj]:
        owner = {"namespace": "ns", "kind": "Deployment", "name": name}
        return key, {"cluster": cluster, "owner": owner, "transition": "rollingBack", "turn": 1}

    received = [sent("ok", "k1"), sent("twice", "k2"), sent("twice", "k3"),
                sent("missed", "k4", cluster="another")]  # fmt: skip
    found = found_by(invariants.notifications, evidence(timeline=timeline, received=received))
    assert sorted(found) == [
        "notNotified: ns/Deployment/missed: rollingBack turn 1",
        "notifiedTwice: ns/Deployment/twice: rollingBack turn 1: 2 keys",
    ]


async def test_the_oracle_sees_a_signal_from_an_intake_that_does_not_lead() -> None:
    timeline = Timeline()
    now = time.time()
    timeline.holders = [(now - 10, "intake-a"), (now - 5, "intake-b")]

    def signalled(by: str, at: float) -> HistoryEvent:
        event = HistoryEvent(event_id=5)
        event.event_time.FromSeconds(int(at))
        event.workflow_execution_signaled_event_attributes.identity = by
        return event

    def updated(by: str, at: float) -> HistoryEvent:  # a control Update a worker accepted
        event = HistoryEvent(event_id=6)
        event.event_time.FromSeconds(int(at))
        accepted = event.workflow_execution_update_accepted_event_attributes
        accepted.accepted_request.meta.identity = by
        return event

    events = [signalled("intake-a", now - 8), signalled("intake-a", now - 2),
              signalled("rollbackctl", now - 1),
              updated("intake-a", now - 2),  # annotated while it led: fine
              updated("intake-a", now + 20)]  # fmt: skip

    class Handle:
        async def fetch_history_events(self):  # type: ignore[no-untyped-def]
            for event in events:
                yield event

    class Runs:
        async def list_workflows(self, query: str):  # type: ignore[no-untyped-def]
            yield SimpleNamespace(run_id="r1")

        def get_workflow_handle(self, workflow_id: str, run_id: str) -> Handle:
            return Handle()

    w = Workload(0, FATES[0], "ns", "a", "Deployment", "RollbackPolicy")
    w.controls = [now - 7, now + 15]  # the second annotated once intake-b led
    found: list[str] = []
    ev = evidence(workloads=[w], timeline=timeline)
    await invariants.non_leader_signals(
        ev, Runs(), lambda kind, what: found.append(f"{kind}: {what}")
    )
    assert found == 2 * [
        "nonLeaderSignals: intake-a signalled ns/Deployment/a while 'intake-b' led"
    ]


def test_the_published_soak_at_1000_workloads_is_of_every_invariant() -> None:
    """bench/RESULTS.md's two newest 1,000-workload runs count every invariant the oracle has
    now, over every fate: a new invariant (or fate) needs the published runs made again. (What
    they found is recorded as measured: a count above 0 says NOT MET there.)"""
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    soak = text[text.index("## Soak: many workloads") :]
    runs = re.split(r"\n  (?:cluster bench: )?1000 workloads, ", soak)[1:]
    assert len(runs) >= 2, "no two 1,000-workload runs recorded"
    for run in runs[-2:]:
        counts = dict(re.findall(r"\n  \| (\w+) \| (\d+[^|]*?) \|", run.split("\n  faults")[0]))
        assert set(INVARIANTS) <= set(counts), sorted(set(INVARIANTS) - set(counts))
        dealt = {w.fate.name for w in plan(1000, 50)}  # every fate of a cluster in annotations
        assert f"{len(dealt)} scripted fates" in run
