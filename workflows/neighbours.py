"""What the verdict makes of the owner's neighbours, its HPA and its releases: pure (the machine).

- **The autoscaler check** (``autoscaler_check``, a policy's ``healthChecks.autoscaler``): the
  owner's HorizontalPodAutoscaler read when the window opens and at its end. A cut of CPU
  requests raises every pod's utilisation of them, so a CPU-utilisation HPA scales out: the
  check fails (``autoscalerScaledOut``) when the HPA is pinned at ``maxReplicas`` at the end and
  was not at the open (``failAtMax``), or its desired replicas grew by more than
  ``maxGrowthPercent``. An HPA already at its maximum when the window opened cannot show what
  the cut did: the pin is then not judged (growth still is, from the open's reading). No HPA at
  the end: not applicable (it passes, saying so).
- **The cohort beside an HPA** (``judged_cohort``): adoption is judged over the pods that exist.
  Where the owner's HPA scaled it in during the window, the baseline is lowered to the desired
  replicas at the end (the HPA removed those pods, not the cut); pods it added count for
  adoption as any pod beyond the baseline does, and never raise it.
- **A release** (``release_seen``): the owner's pod template at the verdict differs from the
  window's open (``activities.neighbours.template_of``: not the resources, not a restart). The
  cut is not judged on it: the verdict waits for the release to roll out, looking again after
  ``release_recheck``, then a fresh window of the same turn judges the cut on the new release.
"""

from __future__ import annotations

from datetime import timedelta

from workflows.activity_api import CheckResult, CohortSample
from workflows.contract import FailureReason
from workflows.policy import AutoscalerCheck
from workflows.state import Autoscaler, Template

AUTOSCALER = "autoscaler"  # the check's name, as the verdict and ``describe`` show it
RELEASE_RECHECK = timedelta(seconds=10)  # a release not rolled out yet: looked at again after
RELEASE_RECHECK_MAX = timedelta(minutes=5)  # ... doubling up to this (a bounded history)


def autoscaler_check(
    check: AutoscalerCheck, before: Autoscaler | None, after: Autoscaler | None
) -> CheckResult:
    """The autoscaler check at the verdict: ``before`` read when the window opened, ``after``
    at its end."""
    reason = FailureReason.AUTOSCALER_SCALED_OUT
    bounds = ["not pinned at maxReplicas"] if check.fail_at_max else []
    if check.max_growth_percent is not None:
        bounds.append(f"grown at most {check.max_growth_percent}%")
    bound = ", ".join(bounds)
    if after is None:
        why = f"{AUTOSCALER}: not applicable: no HorizontalPodAutoscaler scales the owner"
        return CheckResult(
            name=AUTOSCALER, reason=reason, bound=bound, passed=True, applicable=False, message=why
        )
    was = before.desired if before is not None else None
    shown = f"{was} -> {after.desired}" if was is not None else f"{after.desired}"
    said = f"HPA {after.name}: {shown} desired replicas (min {after.min}, max {after.max})"
    failures = []
    already = before is not None and before.desired >= before.max
    if check.fail_at_max and after.desired >= after.max and not already:
        failures.append("pinned at its maxReplicas: it can no longer absorb a peak")
    growth = None
    if was is not None and was > 0:
        growth = (after.desired - was) * 100 / was
        limit = check.max_growth_percent
        if limit is not None and growth > limit:
            failures.append(f"grown {growth:.0f}%, more than {limit}%")
    if already:
        said += "; at its maximum when the window opened already: the pin is not judged"
    elif before is None:
        said += "; not read when the window opened: only the pin is judged"
    return CheckResult(
        name=AUTOSCALER,
        reason=reason,
        value=float(after.desired),
        baseline=float(was) if was is not None else None,
        bound=bound,
        passed=not failures,
        message=f"{said}: {'; '.join(failures)}" if failures else said,
    )


def judged_cohort(baseline: int, sample: CohortSample) -> tuple[int, str]:
    """The cohort size the verdict judges, and what to say of it: the baseline, lowered to the
    desired replicas at the end where the owner's HPA scaled it in."""
    hpa, desired = sample.autoscaler, sample.desired
    if hpa is None or desired is None or desired >= baseline:
        return baseline, ""
    return desired, f" (HPA {hpa.name} scaled the cohort in from {baseline})"


def release_seen(before: Template | None, after: Template | None) -> str | None:
    """What a release changed between the window's open (``before``) and now; None when the
    pod template is the same (or either was not read)."""
    if before is None or after is None or before.fingerprint == after.fingerprint:
        return None
    images = [
        f"{name} {before.images.get(name, '(new)')} -> {image}"
        for name, image in sorted(after.images.items())
        if before.images.get(name) != image
    ]
    what = ", ".join(images) if images else "not its images"
    return f"its pod template changed ({what})"


def release_recheck(looks: int) -> timedelta:
    """How long a verdict waiting for a release looks again after, its ``looks``-th time."""
    return min(RELEASE_RECHECK_MAX, RELEASE_RECHECK * (1 << min(looks, 10)))
