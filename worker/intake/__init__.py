"""The intake controller: turns cluster changes into rollback workflows.

It watches pods (all namespaces), both policy kinds (into a ``PolicyIndex``), namespaces, and
the workload kinds (``worker.workloads``: owners and their labels and state from a watch cache,
not a GET per pod). When a pod *newly adopts* a recommendation (it carries it and its actual
resources equal it, where before it did not), the intake resolves the pod's owner and policy and
signal-with-starts the owner's workflow (``observe``), carrying the policy it resolved into the
attempt it opens. The workflow decides what that means: join the current window, supersede it
with a new fingerprint, reopen a succeeded turn for a newer pod, or start the next turn after
``backedOff``.

Eight modules, importing downward only (the import-linter contracts in pyproject.toml), along
the seams of kopf's reactor:

- ``watching`` (``Intake``): the informers, what they last showed, per-owner queueing; the one
  owner of that state.
- ``controls`` (``Controls``): the kubectl control annotation, carried out once.
- ``suspects`` (``Suspects``): the early verdict's side, a pod failing for certain told to its
  owner's run, the pods that may fail kept by owner for when its window shows.
- ``pauses`` (``Pauses``): the pause annotations and the kill switch as last seen; the runs to
  resume when one goes.
- ``sightings`` (``Sightings``): each owner's newest adoption, signal-with-started in its turn
  under the Temporal budget, retried until accepted, withheld while automation is disabled.
- ``delivery`` (``Delivery``): resumes, suspects and Events; the fence and the loop every send
  goes through, and what is in flight.
- ``budget`` (``Budget``): the pacer of the Temporal budget.
- ``causes``: what a change means, one pure function per cause (adoption, a backed-off turn
  going on, a pause, a pod failing for certain, a policy event), tested without a cluster.

What the intake promises:

- No policy matches: retained. No workflow, no annotation.
- A sighting that the owner's stored state says would not wake it (``workflows.wake``, the rule
  the workflow itself applies: a settled fingerprint with no newer pod, a cancel, a permanent
  failure) signals nothing, so a restart or a relist does not wake every workload.
- Duplicate events (a pod updated without a change in what it adopted) signal nothing.
- One signal per (owner, fingerprint, stored state): the other pods of a rollout adopting the
  same recommendation signal nothing more, nor do they while the attempt they woke is running.
- A turn that ends ``backedOff`` goes on when its pods adopt the recommendation again; pods that
  never left it (nothing recreated them before the re-apply) are taken as adopting it when the
  owner's state turns ``backedOff``.
- Signals are sent off the watch thread, at most ``MAX_CONCURRENT_SIGNALS`` at once; an owner has
  at most one undelivered sighting (the newest), retried until Temporal accepts it.
- At start-up and after a relist, what the LIST shows is batched per (owner, fingerprint).
- A malformed recommendation annotation gets a Warning Event on the pod and a log line.
- The control annotation on an owner (``rightsizing.kubex.ai/rollback-control: cancel|reopen``)
  becomes the Update ``rollbackctl`` sends, then is removed; a control that would change nothing
  gets a ``RollbackControlRejected`` Event saying why (docs/concepts/status-and-control.md,
  "Control from kubectl").
- Each policy's ``status`` is kept by ``worker.status`` from these same watches.
- The kill switch (``rightsizing.kubex.ai/automation: disabled`` on the engine's namespace)
  withholds every sighting until it is enabled again; then they are sent, and the runs it held
  (a backoff's end, a re-apply) are resumed.
- A pause annotation (``rightsizing.kubex.ai/pause-until``, ``workflows.pause``) that goes or
  changes on a namespace, an owner or a pod signals ``resume`` to the runs it may hold (owners
  with an active state there), so a held verdict or rollback looks again within seconds. A pause
  that went between two leaders' terms, when no watch saw it go, is found at the next term's
  start: every run Temporal shows held (``RollbackHeld``) is resumed, and looks again.
"""

from worker.intake.causes import adopted_recommendation
from worker.intake.delivery import MAX_CONCURRENT_SIGNALS, SIGNAL_TIMEOUT
from worker.intake.watching import Intake

__all__ = ["MAX_CONCURRENT_SIGNALS", "SIGNAL_TIMEOUT", "Intake", "adopted_recommendation"]
