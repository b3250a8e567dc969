"""Every write that changes what runs goes through one gate (``KubernetesActivities._gate``),
which reads the pause at every level right before it: driven here step by step (the verdict,
the rollback, the backoff's end and its record, the re-apply), pause level by level (a pod,
the owner, the namespace), in both actuation modes, over the real client. Under the pause the
emulator's journal shows no acting write (no rollback annotation published or cleared, no
``pods/resize``) and each step says it is held; once the pause is lifted, the same call does
its write."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client import CoreV1Api, CustomObjectsApi

from activities.kubernetes import KubernetesActivities
from sim.apiserver import Fault, KubeEmulator
from tests import CLUSTER
from tests.activity.builders import NS, node, owner, pod, policy
from tests.activity.test_kubernetes_activities import LAST_GOOD, REC, SINCE, ref
from worker.kube import api_client
from workflows.activity_api import (
    ReapplyInput,
    RecordTransitionInput,
    ResolvePolicyInput,
    RollBackInput,
    SampleCohortInput,
)
from workflows.contract import (
    AUTOMATION_ANNOTATION,
    DEFAULT_ENGINE_NAMESPACE,
    PAUSE_UNTIL_ANNOTATION,
    ROLLBACK_LIMITS_ANNOTATION,
    ROLLBACK_REQUESTS_ANNOTATION,
    ROLLBACK_STATE_ANNOTATION,
    STORM_BREAKER_ANNOTATION,
    Actuation,
    Mode,
    RollbackTarget,
)
from workflows.pause import PauseScope
from workflows.state import OwnerState

MERGE = "application/merge-patch+json"
ROLLBACK_KEYS = {ROLLBACK_REQUESTS_ANNOTATION, ROLLBACK_LIMITS_ANNOTATION}
PUBLISHED = {ROLLBACK_REQUESTS_ANNOTATION: '{"app": {"memory": "768Mi"}}'}


def acting(api: KubeEmulator) -> list[str]:
    """The acting writes in the journal: a rollback annotation published or cleared on the
    owner, a pod resized."""
    return [
        f"{r.method} {r.path}"
        for r in api.journal
        if r.method == "PATCH"
        and r.status < 300
        and (r.path.endswith("/resize") or ROLLBACK_KEYS & set(r.annotations))
    ]


def level_of(api: KubeEmulator, level: str) -> tuple[Any, str | None, str]:
    """Where a pause at ``level`` is annotated: (type, namespace, name)."""
    store = api.store
    return {
        "pod": (store.rtype("Pod"), NS, "web-0"),
        "owner": (store.rtype("Deployment"), NS, "web"),
        "namespace": (store.rtype("Namespace"), None, NS),
    }[level]


def annotate(api: KubeEmulator, level: str, value: str | None) -> None:
    rtype, namespace, name = level_of(api, level)
    body = {"metadata": {"annotations": {PAUSE_UNTIL_ANNOTATION: value}}}
    api.store.patch(rtype, namespace, name, body, MERGE)


def backed_off() -> OwnerState:
    return OwnerState(
        mode=Mode.BACKED_OFF,
        active_recommendation_fingerprint=REC.fingerprint,
        turn=1,
        last_transition_time=SINCE,
    )


Step = Callable[[KubernetesActivities], Any]
STEPS: dict[str, Step] = {
    "verdict": lambda a: a.sample_cohort(
        SampleCohortInput(
            cluster=CLUSTER, owner=ref(), recommendation=REC, window_started_at=SINCE, final=True
        )
    ),
    "rollback": lambda a: a.roll_back(
        RollBackInput(
            cluster=CLUSTER, owner=ref(), target=RollbackTarget.LAST_SUCCESSFUL, resources=LAST_GOOD
        )
    ),
    "backoff end": lambda a: a.resolve_policy(
        ResolvePolicyInput(cluster=CLUSTER, owner=ref(), attempt=REC.fingerprint)
    ),
    "backoff end's record": lambda a: a.record_transition(
        RecordTransitionInput(
            cluster=CLUSTER,
            owner=ref(),
            state=backed_off(),
            event_id="run.3.backedOff",
            clear_rollback_recommendation=True,
        )
    ),
    "re-apply": lambda a: a.reapply_recommendation(
        ReapplyInput(cluster=CLUSTER, owner=ref(), recommendation=REC)
    ),
}
# What each step writes once no pause holds it, by actuation mode: (publishes or clears a
# rollback annotation, resizes pods).
WRITES = {
    ("verdict", Actuation.ANNOTATIONS): (False, False),
    ("verdict", Actuation.IN_PLACE): (False, False),
    ("rollback", Actuation.ANNOTATIONS): (True, False),
    ("rollback", Actuation.IN_PLACE): (True, True),
    ("backoff end", Actuation.ANNOTATIONS): (False, False),  # it decides; its record writes
    ("backoff end", Actuation.IN_PLACE): (False, False),
    ("backoff end's record", Actuation.ANNOTATIONS): (True, False),
    ("backoff end's record", Actuation.IN_PLACE): (True, False),
    ("re-apply", Actuation.ANNOTATIONS): (False, False),  # the record's clearing re-applies
    ("re-apply", Actuation.IN_PLACE): (False, True),
}


@pytest.fixture
def api() -> Iterator[KubeEmulator]:
    with KubeEmulator() as emulator:
        emulator.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        emulator.store.create(node("roomy", memory="16Gi"))
        deployment = owner("Deployment", replicas=2)
        deployment["metadata"]["annotations"] = dict(PUBLISHED)  # a rollback is published
        emulator.store.create(deployment)
        for i in range(2):  # running the cut (512Mi): a rollback resizes them, a re-apply not
            emulator.store.create(pod(f"web-{i}", {"app": "web"}, memory="512Mi", rec=REC,
                                      node="roomy"))  # fmt: skip
        yield emulator


def held(step: str, result: Any) -> bool:
    if step == "verdict":
        return result.paused is not None
    return getattr(result, "paused", None) is not None


@pytest.mark.parametrize("mode", [Actuation.ANNOTATIONS, Actuation.IN_PLACE], ids=str)
@pytest.mark.parametrize("level", ["pod", "owner", "namespace"])
@pytest.mark.parametrize("step", list(STEPS))
def test_no_step_acts_under_a_pause_at_any_level_and_each_does_once_lifted(
    api: KubeEmulator, step: str, level: str, mode: Actuation
) -> None:
    publishes, resizes = WRITES[(step, mode)]
    if step == "re-apply":  # the pods run the rolled-back resources: a re-apply resizes them
        for i in range(2):
            body = {"spec": {"containers": [{"name": "app", "resources": {
                "requests": {"memory": "768Mi"}}}]}}  # fmt: skip
            api.store.patch(api.store.rtype("Pod"), NS, f"web-{i}", body, MERGE)
        rec_pods = api.store.items("Pod", NS)
        assert all(p["spec"]["containers"][0]["resources"]["requests"]["memory"] == "768Mi"
                   for p in rec_pods)  # fmt: skip
    with api_client(url=api.url) as client:
        acts = KubernetesActivities(CoreV1Api(client), CustomObjectsApi(client), mode, "test")
        annotate(api, level, "infinite")
        api.clear_journal()
        result = STEPS[step](acts)
        assert held(step, result), (step, level, mode, result)
        assert acting(api) == [], (step, level, mode)
        annotate(api, level, None)  # lifted
        api.clear_journal()
        result = STEPS[step](acts)
        assert not held(step, result), (step, level, mode, result)
    wrote = acting(api)
    assert any("/resize" in w for w in wrote) == resizes, wrote
    assert any("/deployments/web" in w for w in wrote) == publishes, wrote


BRINGS_BACK = ("backoff end", "backoff end's record", "re-apply")  # a cut back on the pods


def switch(api: KubeEmulator, value: str | None) -> None:
    """The engine's kill switch on its namespace (``default`` outside a cluster)."""
    body = {"metadata": {"annotations": {AUTOMATION_ANNOTATION: value}}}
    api.store.patch(api.store.rtype("Namespace"), None, DEFAULT_ENGINE_NAMESPACE, body, MERGE)


def backing_off_turn_1_of(api: KubeEmulator, turns: int) -> None:
    """The engine's namespace, a policy of ``turns`` turns, the owner backing off turn 1."""
    api.store.create({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": DEFAULT_ENGINE_NAMESPACE}})  # fmt: skip
    api.store.create(
        policy(backoff={"timePeriod": "1s", "multiplyByTurn": 1, "maxAttempts": turns})
    )
    backing_off = backed_off().model_copy(update={"mode": Mode.BACKING_OFF})
    state = {"metadata": {"annotations": {ROLLBACK_STATE_ANNOTATION: backing_off.to_json()}}}
    api.store.patch(api.store.rtype("Deployment"), NS, "web", state, MERGE)


@pytest.mark.parametrize("mode", [Actuation.ANNOTATIONS, Actuation.IN_PLACE], ids=str)
@pytest.mark.parametrize("step", list(STEPS))
def test_automation_off_holds_what_brings_a_cut_back_and_lets_verdicts_and_rollbacks_go(
    api: KubeEmulator, step: str, mode: Actuation
) -> None:
    """The kill switch is no pause: a verdict is taken and a rollback written under it; a
    backoff's end, its record and a re-apply are held, and go once automation is on again."""
    if step == "re-apply":  # as above: the pods run the rolled-back resources
        for i in range(2):
            body = {"spec": {"containers": [{"name": "app", "resources": {
                "requests": {"memory": "768Mi"}}}]}}  # fmt: skip
            api.store.patch(api.store.rtype("Pod"), NS, f"web-{i}", body, MERGE)
    # Backing off turn 1 of 2: its backoff's end re-applies (the last turn's would not, and is
    # not held: the next test).
    backing_off_turn_1_of(api, 2)
    publishes, resizes = WRITES[(step, mode)]
    with api_client(url=api.url) as client:
        acts = KubernetesActivities(CoreV1Api(client), CustomObjectsApi(client), mode, "test")
        switch(api, "disabled")
        api.clear_journal()
        result = STEPS[step](acts)
        if step in BRINGS_BACK:
            assert held(step, result), (step, mode, result)
            assert result.paused.scope is PauseScope.CLUSTER
            assert "automation disabled by rightsizing.kubex.ai/automation" in (
                result.paused.describe()
            )
            assert acting(api) == [], (step, mode)
            switch(api, "enabled")
            api.clear_journal()
            result = STEPS[step](acts)
        assert not held(step, result), (step, mode, result)
    wrote = acting(api)
    assert any("/resize" in w for w in wrote) == resizes, wrote
    assert any("/deployments/web" in w for w in wrote) == publishes, wrote


def test_automation_off_does_not_hold_the_last_turns_backoff_end(api: KubeEmulator) -> None:
    """The last turn's backoff ends failedPermanent: nothing re-applied, nothing to hold."""
    backing_off_turn_1_of(api, 1)
    switch(api, "disabled")
    with api_client(url=api.url) as client:
        acts = KubernetesActivities(
            CoreV1Api(client), CustomObjectsApi(client), Actuation.ANNOTATIONS, "test"
        )
        assert STEPS["backoff end"](acts).paused is None
        annotate(api, "namespace", "infinite")  # a pause holds it all the same
        assert STEPS["backoff end"](acts).paused is not None


# --- what brings a cut back, whichever path writes it (machine.brings_back) --------------------

HOLDS = {  # each hold, as an operator sets it: (where, what)
    "kill switch": (AUTOMATION_ANNOTATION, "disabled"),
    "storm breaker": (STORM_BREAKER_ANNOTATION, "2026-12-07T10:00:00Z"),
}


def hold(api: KubeEmulator, which: str, on: bool) -> None:
    key, value = HOLDS[which]
    body = {"metadata": {"annotations": {key: value if on else None}}}
    api.store.patch(api.store.rtype("Namespace"), None, DEFAULT_ENGINE_NAMESPACE, body, MERGE)


def policy_gone(api: KubeEmulator, how: str) -> None:
    """No policy matches the owner any more: deleted, relabelled away, or edited invalid."""
    rtype = api.store.rtype("RollbackPolicy")
    match how:
        case "deleted":
            api.store.delete(rtype, NS, "p")
        case "relabelled":
            body = {"spec": {"scope": {"labelSelector": {"matchLabels": {"team": "other"}}}}}
            api.store.patch(rtype, NS, "p", body, MERGE)
        case "invalid":  # the store's own patch skips the CRD's validation, as an old one would
            api.store.patch(rtype, NS, "p", {"spec": {"adoptionThresholdPercent": 0}}, MERGE)


def cleared() -> RecordTransitionInput:
    """The record of a backoff's end whose policy is gone: the state and the rollback removed,
    marked by the machine as bringing the cut back."""
    return RecordTransitionInput(
        cluster=CLUSTER, owner=ref(), state=None, event_id="run.3.cleared",
        clear_rollback_recommendation=True, brings_back=True,
    )  # fmt: skip


@pytest.mark.parametrize("how", ["deleted", "relabelled", "invalid"])
@pytest.mark.parametrize("which", list(HOLDS))
def test_a_backoff_end_whose_policy_is_gone_is_held_as_a_re_apply_is(
    api: KubeEmulator, which: str, how: str
) -> None:
    """Its end clears the state and the rollback, and the applier re-applies the cut: the kill
    switch and the breaker hold it, its end and its record, until lifted (before, the end was
    taken for a last turn's and went through: the pods back on the cut, automation off)."""
    backing_off_turn_1_of(api, 3)
    policy_gone(api, how)
    hold(api, which, True)
    with api_client(url=api.url) as client:
        acts = KubernetesActivities(
            CoreV1Api(client), CustomObjectsApi(client), Actuation.ANNOTATIONS, "test"
        )
        api.clear_journal()
        end = STEPS["backoff end"](acts)
        assert end.policy is None and end.paused is not None, end
        assert end.paused.scope in (PauseScope.CLUSTER, PauseScope.BREAKER)
        record = acts.record_transition(cleared())
        assert record.paused is not None and acting(api) == [], record
        hold(api, which, False)
        assert STEPS["backoff end"](acts).paused is None
        assert acts.record_transition(cleared()).paused is None
    assert any("/deployments/web" in w for w in acting(api)), "the rollback cleared once lifted"


def test_a_retry_after_failed_permanent_is_held_before_its_state_is_written(
    api: KubeEmulator,
) -> None:
    """A reopen after failedPermanent writes ``monitoring`` over it, and the applier re-applies
    the cut on that alone (annotations mode): that record is held by the kill switch and by a
    pause, as the re-apply after it is (before, it was written first, the re-apply held after)."""
    failed = backed_off().model_copy(update={"mode": Mode.FAILED_PERMANENT})
    annotations = {ROLLBACK_STATE_ANNOTATION: failed.to_json(), ROLLBACK_REQUESTS_ANNOTATION: None}
    api.store.patch(api.store.rtype("Deployment"), NS, "web", {"metadata": {"annotations":
                                                                annotations}}, MERGE)  # fmt: skip
    api.store.create({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": DEFAULT_ENGINE_NAMESPACE}})  # fmt: skip
    retry = RecordTransitionInput(
        cluster=CLUSTER, owner=ref(), event_id="run.1.monitoring", brings_back=True,
        state=backed_off().model_copy(update={"mode": Mode.MONITORING, "turn": 1}),
    )  # fmt: skip

    def stored() -> str:
        annotations = api.store.get(api.store.rtype("Deployment"), NS, "web")["metadata"]
        return str(OwnerState.model_validate_json(annotations["annotations"][
            ROLLBACK_STATE_ANNOTATION]).mode)  # fmt: skip

    with api_client(url=api.url) as client:
        acts = KubernetesActivities(
            CoreV1Api(client), CustomObjectsApi(client), Actuation.ANNOTATIONS, "test"
        )
        hold(api, "kill switch", True)
        assert acts.record_transition(retry).paused is not None
        hold(api, "kill switch", False)
        annotate(api, "owner", "infinite")
        assert acts.record_transition(retry).paused is not None
        assert stored() == "failedPermanent"
        annotate(api, "owner", None)
        assert acts.record_transition(retry).state_written
        assert stored() == "monitoring"


@pytest.mark.parametrize("mode", [Actuation.ANNOTATIONS, Actuation.IN_PLACE], ids=str)
@pytest.mark.parametrize("step", ["rollback", "backoff end's record", "re-apply"])
def test_a_pause_set_between_the_gate_and_its_write_holds_the_write(
    api: KubeEmulator, step: str, mode: Actuation
) -> None:
    """The write is its own last check: a pause set on the owner right after the gate read it
    (here, as the gate's LIST of the cohort returns) holds the write all the same, in place
    before the first batch too (before, a rollback's first write and the first batch of
    resizes went ahead)."""
    if step == "re-apply":  # the pods run the rolled-back resources: a re-apply resizes them
        for i in range(2):
            body = {"spec": {"containers": [{"name": "app", "resources": {
                "requests": {"memory": "768Mi"}}}]}}  # fmt: skip
            api.store.patch(api.store.rtype("Pod"), NS, f"web-{i}", body, MERGE)
    if step == "rollback":  # nothing published yet: the rollback publishes it
        body = {"metadata": {"annotations": {ROLLBACK_REQUESTS_ANNOTATION: None}}}
        api.store.patch(api.store.rtype("Deployment"), NS, "web", body, MERGE)
    with api_client(url=api.url) as client:
        acts = KubernetesActivities(CoreV1Api(client), CustomObjectsApi(client), mode, "test")
        listed = acts.lookup.pods_listed

        def pause_after_listing(*args: Any, **kwargs: Any) -> Any:
            found = listed(*args, **kwargs)
            annotate(api, "owner", "infinite")  # in the gap between the gate and the write
            return found

        acts.lookup.pods_listed = pause_after_listing  # type: ignore[method-assign]
        api.clear_journal()
        result = STEPS[step](acts)
        assert acting(api) == [], (step, mode, acting(api))
        assert held(step, result) or WRITES[(step, mode)] == (False, False), (step, mode, result)


def test_a_throttled_write_is_not_resent_past_the_hold_set_meanwhile(api: KubeEmulator) -> None:
    """A backoff end's record answered 429 (Retry-After: 1 s, as the API server's priority and
    fairness answers) while the kill switch is switched off: the client does not resend it by
    itself a second later; the writer tries again, its gate read first, and holds it. Before,
    urllib3 resent it past the gate (the soak saw a backoff's end land 1.6 s into the off)."""
    api.store.create({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": DEFAULT_ENGINE_NAMESPACE}})  # fmt: skip
    throttled = api.inject(Fault(status=429, method="PATCH", path="/deployments/web$",
                                 after=lambda _: hold(api, "kill switch", True)))  # fmt: skip
    with api_client(url=api.url) as client:
        acts = KubernetesActivities(
            CoreV1Api(client), CustomObjectsApi(client), Actuation.ANNOTATIONS, "test"
        )
        api.clear_journal()
        result = STEPS["backoff end's record"](acts)
    assert throttled.hits == 1
    assert result.paused is not None and result.paused.scope is PauseScope.CLUSTER
    assert acting(api) == [], acting(api)
    assert ROLLBACK_REQUESTS_ANNOTATION in api.store.get(
        api.store.rtype("Deployment"), NS, "web")["metadata"]["annotations"]  # fmt: skip
