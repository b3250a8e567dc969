"""``python -m bench --only soak [--soak N]``: many workloads, many faults at once, an oracle.

A package: ``fates`` (the scripts), ``supervisor`` (the engine's processes), ``faults`` (the
schedule), ``invariants`` (the oracle, one function each) and ``script`` (the story that plays
them).

N workloads (default 1,000; the CI test runs a fleet of two clusters of 72) across namespaces, two owner kinds
(Deployment, StatefulSet) and both policy kinds, on the simulated cluster, each with a scripted
fate and so a known end (``FATES``). The engine runs as in production, as separate processes:
two workers and two intakes electing a leader on a Lease in the emulator, against the real
Temporal dev server. A fault schedule runs throughout: a worker SIGKILLed (each in turn), the
leading intake SIGKILLed (twice), the leader cut off its Lease for 20 s, its elector stuck in a
renewal past the Lease's expiry, while work falls due (the ``late`` fates applied, the
``cancel-in-cut`` ones annotated) before and after the other intake takes over, Temporal
restarted, the
emulator answering about 10% of the engine's requests with 5xx, 429 or a timeout, 409 to
patches, slow answers, every watch stream cut now and then, and a burst of 503s on one
namespace's pod LISTs through each ``flaky-verdict`` fate's verdict, long enough to drive its
sample from a local activity to a regular one (the fallbacks are counted from the workers' logs).

The oracle, checked once the story has settled, counts what must be 0:

- ``wrongEnd``: a workload whose final mode, turn, failure reason or pods' memory differ from
  its script;
- ``lostOrStuck``: from Temporal's runs of the cluster, closed ones too, against the fates and
  the owners' final states: an attempt that never started, one still running that should have
  ended, or an owner left in a mode that waits for a next step with no run to take it;
- ``doubleRollback``: from the owners' history in the store, a turn that entered ``rollingBack``
  twice, or a rollback published (its annotations written) twice in a turn or outside
  ``rollingBack``;
- ``notNotified`` / ``notifiedTwice``: a notable transition (rollingBack, failedPermanent,
  cancelled, aborted) that no receiver got, or got under two different idempotency keys;
- ``nonLeaderWrites`` / ``nonLeaderSignals``: a write to the API server or a signal (a start,
  a control Update) to a workflow from an intake while the Lease named another holder (the
  emulator records each request's client, from its User-Agent, and the Lease holder over time;
  each signal's identity is in the workflow's history);
- ``actedWhilePaused``: a write of a worker that changes what runs (a rollback annotation
  published or cleared on the owner, one of its pods resized or deleted to be recreated: from
  the emulator's journal) while its pause (``rightsizing.kubex.ai/pause-until``) was in force, from ``GATE_GRACE``
  after it was set (a write already past its gate lands). The ``paused`` fate sets it as its
  window opens, to end after the window; ``paused-infinite`` without an end, lifted by the
  script once the engine's ``RollbackPaused`` Event shows the hold; ``paused-backoff`` as its
  backoff begins, to end after the backoff's end (which must not clear the rollback, and so
  re-apply the cut, before); ``paused-mid-rollback`` (in place) once its paced rollback has a
  pod down, for the next batch to wait; ``paused-at-gate`` without an end, set by the emulator
  right after the worker's LIST of its pods at its backoff's end was answered, before that
  step writes (its write, which reads its gate again, must not go: no grace), and lifted as
  ``paused-infinite``'s;
- ``actedInProtected``: a write by the engine (a worker or an intake, by the User-Agent the
  emulator journals) into ``kube-soak``, a namespace protected by the default patterns that the
  ``protected`` fate's workload lives in and the cluster policy's selector names anyway (our
  policies' status there excepted: it says the namespace is protected);
- ``reappliedWhileOff``: a worker's PATCH that brought a cut back (the owner kept it off, a
  rollback published or ``failedPermanent``, and no more: a backoff's end, a clear for a policy
  gone, a retry), timed as it reached the API server (a write sent before may be served late),
  while the engine's kill switch had automation off, from ``GATE_GRACE`` after it went off. The
  fault schedule switches it off for ``AUTOMATION_OFF`` seconds; the ``policy-deleted-off``
  fate switches it off, deletes its policy mid-backoff, and on once the clear was held;
- ``reappliedWhileTripped``: the same while the intakes' storm breaker was tripped. It is on
  (``--storm-breaker 50%/1m/N``, N a quarter of the workloads): most fates roll back, so it
  trips on each wave of their verdicts, and the script, as an operator would, resets it once
  it has held a backoff's end (its ``RollbackPaused`` Event), or ``BREAKER_HOLD`` seconds after
  it tripped (the held backoffs' ends then go on to the ends their fates give);
- ``moreUnavailable`` (a cluster whose engine actuates in place, ``in_place``: the fleet's second
  cluster): a pod taken down by the engine (a rollback's or a re-apply's resize, a restore's
  delete) while the owner's pods not Ready then (the engine's, and those down for a cause of their own that the
  batch could see) already reached the tighter of its ``maxUnavailable`` (1, set on every
  owner) and the disruption budget over its pods (the ``budget-held`` fate's: maxUnavailable 0
  from its first window until the engine's ``RollbackPaced`` Event shows the hold, then 1).
  Every container's memory resize policy is ``RestartContainer``, so each Ready pod a resize
  reaches restarts; which pods a worker resized and when comes from the emulator's journal,
  when they were Ready, and the budgets, from the store.

Also printed: faults injected by kind, workloads by outcome, the intakes' relists, the peak RSS
of each process, the wall time.
"""

from bench.soak import invariants
from bench.soak.fates import FATES, PROTECTED_NS, Fate, Workload, plan
from bench.soak.invariants import INVARIANTS, Evidence, Timeline
from bench.soak.script import Soak, SoakResult, report, soak, soak_fleet
from bench.soak.supervisor import Child, Receiver

__all__ = [
           "FATES",
           "INVARIANTS",
           "PROTECTED_NS",
           "Child",
           "Evidence",
           "Fate",
           "Receiver",
           "Soak",
           "SoakResult",
           "Timeline",
           "Workload",
           "invariants",
           "plan",
           "report",
           "soak",
           "soak_fleet",
]  # fmt: skip
