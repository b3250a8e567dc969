"""The chaos soak in CI (``bench.soak``, 100 workloads, about 1.5 minutes): many faults at once
on two workers and two leader-electing intakes, and an oracle that knows each workload's end.
Every invariant must be 0. The oracle's own checks are tested on a journal made by hand."""

from __future__ import annotations

import time

from bench.soak import INTAKE_AGENT, Soak, Timeline, report, soak
from sim.apiserver import Request


async def test_the_soak_reports_zero_on_every_invariant() -> None:
    result = await soak(100, deadline=170.0)
    lines = "\n".join(report(result))
    assert result.settled, lines
    assert result.invariants and all(n == 0 for n in result.invariants.values()), lines
    # It was a soak: the faults happened, and the story ran to its known ends.
    for kind in ("worker SIGKILL", "leading intake SIGKILL", "Temporal restart", "503", "429"):
        assert result.faults[kind] > 0, lines
    assert result.outcomes["failedPermanent"] and result.outcomes["cancelled"], lines


def test_the_oracle_sees_a_write_from_an_intake_that_does_not_lead(tmp_path: object) -> None:
    timeline = Timeline()
    now = time.time()
    timeline.holders = [(now - 10, "intake-a"), (now - 5, "intake-b")]
    assert timeline.holder_at(now - 7) == "intake-a" and timeline.holder_at(now) == "intake-b"
    found: list[str] = []

    class Fake:
        pass

    fake = Fake()
    fake.timeline = timeline  # type: ignore[attr-defined]
    fake.api = Fake()  # type: ignore[attr-defined]
    fake.api.journal = [  # type: ignore[attr-defined]
        Request("PATCH", "/apis/apps/v1/namespaces/x/deployments/a", {}, "", 200,
                f"{INTAKE_AGENT}/intake-a", now - 7),  # while it led: fine
        Request("PATCH", "/apis/apps/v1/namespaces/x/deployments/a", {}, "", 200,
                f"{INTAKE_AGENT}/intake-a", now - 1),  # after the Lease moved on: a violation
        Request("PUT", "/apis/coordination.k8s.io/v1/namespaces/default/leases/l", {}, "", 200,
                f"{INTAKE_AGENT}/intake-a", now - 1),  # campaigning: fine
    ]  # fmt: skip
    Soak._writes(fake, lambda kind, what: found.append(f"{kind}: {what}"))  # type: ignore[arg-type]
    assert len(found) == 1 and found[0].startswith("nonLeaderWrites: intake-a PATCH")
