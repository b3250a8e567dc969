"""The owner's neighbours, as the verdict reads them: its HorizontalPodAutoscaler and its releases.

- **The HPA** (``autoscaler_of``): the one HorizontalPodAutoscaler of the owner's namespace whose
  ``spec.scaleTargetRef`` names the owner (its kind and name; KEDA's ScaledObjects act through
  such an HPA, ``keda-hpa-<name>``). Read from ``autoscaling/v2``: its ``status.desiredReplicas``
  and its ``spec.minReplicas``/``maxReplicas``. The policy's autoscaler check compares the
  reading at the window's open with the one at its end (``workflows.machine``).
- **A release** (``template_of``): the owner's pod template, fingerprinted without what the engine
  and the applier change (each container's ``resources``) and without ``kubectl rollout
  restart``'s annotation (a restart runs the same code: its new pods, under the cut, are what
  a verdict judges). A different fingerprint at the verdict than at the window's open is a
  release during the window. ``rolled_out`` says when it is complete, as ``kubectl rollout
  status`` does: every replica updated and available, no old one left, the controller caught up.

Only the kinds that roll out a template have releases here: Deployment, Rollout, StatefulSet,
DaemonSet. The others (a Job's pods run to completion, a Model's template is the operator's)
report none.
"""

from __future__ import annotations

import copy
import hashlib
import json

from activities.owners import OWNER_KINDS, dig
from workflows.contract import API_GROUP, Obj, WorkloadKind
from workflows.state import Autoscaler, Template

RELEASE_KINDS = frozenset(
    {
        WorkloadKind.DEPLOYMENT,
        WorkloadKind.ROLLOUT,
        WorkloadKind.STATEFUL_SET,
        WorkloadKind.DAEMON_SET,
    }
)
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"  # kubectl rollout restart's: not a release
OURS = ("rightsizing.kubex.ai/", f"{API_GROUP}/")  # the applier's and the engine's annotations


def template_of(kind: WorkloadKind, owner: Obj) -> Template | None:
    """The owner's pod template as a release changes it; None for a kind without releases."""
    path = OWNER_KINDS[kind].template
    if kind not in RELEASE_KINDS or path is None:
        return None
    template = copy.deepcopy(dig(owner, *path[:-1]) or {})
    spec = template.get("spec") or {}
    images = {}
    for field in ("initContainers", "containers"):
        for container in spec.get(field) or []:
            container.pop("resources", None)
            if field == "containers":
                images[str(container.get("name", ""))] = str(container.get("image", ""))
    annotations = dig(template, "metadata", "annotations") or {}
    for key in list(annotations):
        if key == RESTARTED_AT or key.startswith(OURS):
            del annotations[key]
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return Template(fingerprint=hashlib.sha256(canonical.encode()).hexdigest()[:16], images=images)


def rolled_out(kind: WorkloadKind, owner: Obj) -> bool | None:
    """Whether the owner's rollout is complete (``kubectl rollout status``'s rules); None for a
    kind without releases."""
    if kind not in RELEASE_KINDS:
        return None
    status, spec = owner.get("status") or {}, owner.get("spec") or {}
    if int(status.get("observedGeneration") or 0) < int(owner["metadata"].get("generation") or 0):
        return False  # the controller has not seen the latest spec yet
    if kind is WorkloadKind.DAEMON_SET:
        scheduled = int(status.get("desiredNumberScheduled") or 0)
        return (
            int(status.get("updatedNumberScheduled") or 0) == scheduled
            and int(status.get("numberAvailable") or 0) == scheduled
        )
    replicas = int(spec.get("replicas", 1))
    updated = int(status.get("updatedReplicas") or 0)
    if kind is WorkloadKind.STATEFUL_SET:
        revisions = status.get("currentRevision"), status.get("updateRevision")
        return (
            updated == replicas
            and int(status.get("readyReplicas") or 0) == replicas
            and (None in revisions or revisions[0] == revisions[1])
        )
    return (
        updated == replicas
        and int(status.get("replicas") or 0) == updated
        and int(status.get("availableReplicas") or 0) == updated
    )


def autoscaler_of(kind: WorkloadKind, name: str, hpas: list[Obj]) -> Autoscaler | None:
    """The HPA among ``hpas`` (one namespace's) that scales the owner; None when none does."""
    for hpa in hpas:
        target = dig(hpa, "spec", "scaleTargetRef") or {}
        if target.get("kind") == kind.value and target.get("name") == name:
            spec = hpa.get("spec") or {}
            return Autoscaler(
                name=hpa["metadata"]["name"],
                desired=int(dig(hpa, "status", "desiredReplicas") or 0),
                min=int(spec.get("minReplicas") or 1),
                max=int(spec.get("maxReplicas") or 1),
            )
    return None
