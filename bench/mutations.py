"""``python -m bench.mutations [NAME ...]``: do the soak and the tests catch what they claim to?
Each mutation puts a known defect into a copy of the product (a git worktree of HEAD, texts
replaced), and either runs a one-cluster soak of 100 workloads there (on a cluster whose
engine actuates in place for a defect only in-place work can show) and checks that the
invariant meant for that defect fires, or, for a defect no soak can show (a query that reads
another tenant, a policy that stalls the intake), runs the test meant for it and checks that it
fails. Prints a line per mutation and exits 1 if any was missed. About 2 minutes a soak; run
alone, not in CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Edit:
    path: str  # in the repository
    old: str  # replaced once; it must appear exactly once
    new: str


@dataclass(frozen=True)
class Mutation:
    name: str
    edits: tuple[Edit, ...]  # the defect: every edit, made together
    caught_by: tuple[str, ...]  # the invariants meant for it: one of them must fire
    in_place: bool = False  # soaked on a cluster whose engine actuates in place
    test: str = ""  # instead of a soak: the pytest node meant for it, which must fail
    env: tuple[tuple[str, str], ...] = ()  # for that test


def _one(name: str, path: str, old: str, new: str, *caught_by: str) -> Mutation:
    return Mutation(name, (Edit(path, old, new),), caught_by)


def _tested(name: str, path: str, old: str, new: str, test: str, **env: str) -> Mutation:
    return Mutation(name, (Edit(path, old, new),), (), test=test, env=tuple(env.items()))


MUTATIONS = [
    _one(
        "the intake's per-write fence check removed (Intake.acting)",
        "worker/intake/watching.py",
        "        return not self.informers.ended.is_set() and self._fence() > 0\n",
        "        return not self.informers.ended.is_set()\n",
        "nonLeaderWrites",
        "nonLeaderSignals",
    ),
    _one(
        "the intake never starts the attempts of one fate (healthy)",
        "worker/intake/watching.py",
        "            self.sightings.offer(seen, state, self._policy(seen.owner, obj))\n",
        '            if not seen.owner.name.startswith("healthy-"):\n'
        "                self.sightings.offer(seen, state, self._policy(seen.owner, obj))\n",
        "lostOrStuck",
    ),
    _one(
        "the previous turn's rollback published again as a re-apply clears it",
        "activities/kubernetes.py",
        "            try:\n"
        "                obj, written = self.writer.patch_annotations(\n"
        "                    input.owner,\n"
        "                    wanted,\n"
        "                    held=self._record_gate(input),\n"
        "                    stale=lambda obj: _newer_of_its_run(obj, input.state),\n"
        "                )\n",
        '            before = (self.lookup.get(input.owner) or {}).get("metadata") or {}\n'
        "            try:\n"
        "                obj, written = self.writer.patch_annotations(\n"
        "                    input.owner,\n"
        "                    wanted,\n"
        "                    held=self._record_gate(input),\n"
        "                    stale=lambda obj: _newer_of_its_run(obj, input.state),\n"
        "                )\n"
        '                kept = {k: v for k, v in (before.get("annotations") or {}).items()\n'
        "                        if k in (ROLLBACK_REQUESTS_ANNOTATION, ROLLBACK_LIMITS_ANNOTATION)}\n"
        "                if input.clear_rollback_recommendation and kept and obj is not None:\n"
        "                    self.writer.patch_annotations(input.owner, kept)\n",
        "doubleRollback",
    ),
    _one(
        "a local activity that keeps failing ends the attempt (no regular-activity fallback)",
        "workflows/rollback.py",
        "                workflow.logger.warning(\n"
        '                    "%s: %s kept failing locally (%s); retrying it as a regular'
        ' activity",\n',
        "                raise _activity_error(name) from cause\n"
        "                workflow.logger.warning(\n"
        '                    "%s: %s kept failing locally (%s); retrying it as a regular'
        ' activity",\n',
        "wrongEnd",
    ),
    Mutation(
        "a backoff's end clears the rollback without the pause gate (its read and its record's)",
        (
            Edit(
                "activities/kubernetes.py",
                "            if input.attempt is not None and _published(obj):\n",
                "            if False:\n",
            ),
            Edit(
                "activities/kubernetes.py",
                "        if not (input.clear_rollback_recommendation or input.brings_back):\n"
                "            return None\n",
                "        if True:\n            return None\n",
            ),
        ),
        ("actedWhilePaused",),
    ),
    Mutation(
        "an in-place batch ignores the disruption budgets over its pods",
        (
            Edit(
                "activities/resize.py",
                "    return (min(budget, pdb.allowed) if pdb is not None else budget), pdb\n",
                "    return budget, None\n",
            ),
        ),
        ("moreUnavailable",),
        in_place=True,
    ),
    _one(
        "the protected namespace patterns ignored",
        "workflows/selection.py",
        "        return next((p for p in self.patterns if glob_match(p, namespace)), None)\n",
        "        return None\n",
        "actedInProtected",
    ),
    _one(
        "the kill switch and the breaker ignored at the gate",
        "activities/kubernetes.py",
        "        off = self.lookup.cluster_hold() if brings_back else None\n",
        "        off = None\n",
        "reappliedWhileOff",
    ),
    Mutation(
        "a backoff's end for a policy gone taken as a last turn's, its record gated for"
        " backedOff alone (#61, 2)",
        (
            Edit(
                "activities/kubernetes.py",
                "                back = machine.brings_back(\n",
                "                back = policy is not None and machine.brings_back(\n",
            ),
            Edit(
                "activities/kubernetes.py",
                "            back = machine.brings_back(\n"
                "                stored.mode if stored else None, after, published=published,"
                " clears=clears\n"
                "            )\n",
                '            back = after == "backedOff"\n',
            ),
        ),
        ("reappliedWhileOff",),
    ),
    _one(
        "an acting write not checked on the writer's own read: the step's gate alone (#61, 3)",
        "activities/writes.py",
        "                if held is not None and (pause := held(obj)) is not None:\n",
        "                if held is not None and attempt and (pause := held(obj)) is not None:\n",
        "actedWhilePaused",
    ),
    Mutation(
        "the old rule: a query judged with $namespace as written, confined when that does not"
        " parse, a variable taken anywhere (#61, 1)",
        (
            Edit("workflows/promql.py", "    check_variables(text)\n", ""),
            Edit(
                "workflows/promql.py",
                '    values = {**PROMQL_VARIABLES, "$namespace": SENTINEL_NAMESPACE}\n',
                '    values = {**PROMQL_VARIABLES, "$namespace": "$namespace"}\n',
            ),
            Edit(
                "workflows/promql.py",
                "    except ValueError as exc:\n        return [str(exc)]\n",
                "    except ValueError:\n        return []\n",
            ),
        ),
        (),
        test="tests/activity/test_tenancy.py::"
        "test_every_accepted_query_reads_its_own_namespace_alone",
        env=(("ROLLBACK_TENANCY_EXAMPLES", "10000"),),
    ),
    _tested(
        "a query's bounds not checked before it is parsed (#61, 4)",
        "workflows/promql.py",
        "    check_bounds(text)\n",
        "",
        "tests/unit/test_promql.py",
    ),
    _tested(
        "a policy validated under the intake's lock (#61, 4)",
        "worker/intake/watching.py",
        "            before = self._policies_handled.get(key)\n        # Validated off the lock",
        "            before = self._policies_handled.get(key)\n"
        "            change = causes.policy_change(event, obj, before)\n"
        "        # Validated off the lock",
        "tests/intake/test_intake.py::"
        "test_a_policy_being_validated_holds_no_other_namespaces_adoption",
    ),
    _one(
        "the storm breaker ignored at the gate (the kill switch kept)",
        "workflows/pause.py",
        "    return automation_off(engine) or breaker_tripped(engine)\n",
        "    return automation_off(engine)\n",
        "reappliedWhileTripped",
    ),
    _one(
        "a workflow ID without its cluster",
        "workflows/activity_api.py",
        '    where = f"{cluster}/" if cluster else ""\n',
        '    where = ""\n',
        "crossedClusters",
    ),
]

SOAK = (
    "import asyncio, json, sys; from bench.soak import soak;"
    " r = asyncio.run(soak(100, deadline=170.0, in_place=sys.argv[1] == 'in-place'));"
    " print('INVARIANTS ' + json.dumps(r.invariants)); print('EXAMPLES ' + json.dumps(r.examples))"
)


def run(mutation: Mutation) -> tuple[bool, dict[str, int], dict[str, list[str]]]:
    """Soak (or test) a copy of HEAD with ``mutation`` in it: (caught, invariants, examples)."""
    with tempfile.TemporaryDirectory(prefix="rollback-mutation-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), "HEAD"],
                       cwd=ROOT, check=True)  # fmt: skip
        try:
            for edit in mutation.edits:
                target = tree / edit.path
                text = target.read_text()
                if text.count(edit.old) != 1:
                    raise SystemExit(f"{mutation.name}: the text to replace is not in {edit.path}")
                target.write_text(text.replace(edit.old, edit.new))
            env = {**os.environ, "PYTHONPATH": str(tree), **dict(mutation.env)}
            if mutation.test:
                tested = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly",
                     "-p", "no:cacheprovider", mutation.test],
                    cwd=tree, capture_output=True, text=True, env=env, check=False, timeout=900,
                )  # fmt: skip
                last = (tested.stdout.strip().splitlines() or [""])[-1]
                return tested.returncode == 1, {}, {"test": [last]}
            actuation = "in-place" if mutation.in_place else "annotations"
            out = subprocess.run(
                [sys.executable, "-c", SOAK, actuation], cwd=tree, capture_output=True, text=True,
                env=env, check=False, timeout=900,
            )  # fmt: skip
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                           check=False)  # fmt: skip
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.stdout.splitlines()
             if line.startswith(("INVARIANTS ", "EXAMPLES "))}  # fmt: skip
    if "INVARIANTS" not in lines:
        raise SystemExit(f"{mutation.name}: the soak did not finish:\n{out.stderr[-3000:]}")
    invariants: dict[str, int] = json.loads(lines["INVARIANTS"])
    examples: dict[str, list[str]] = json.loads(lines["EXAMPLES"])
    return any(invariants.get(i) for i in mutation.caught_by), invariants, examples


def main(names: list[str]) -> int:
    missed = 0
    for mutation in MUTATIONS:
        if names and not any(n in mutation.name for n in names):
            continue
        caught, invariants, examples = run(mutation)
        if mutation.test:
            print(f"{'caught' if caught else 'MISSED'}: {mutation.name}: meant for"
                  f" {mutation.test}, which {'failed' if caught else 'did not fail'}:"
                  f" {examples['test'][0]}", flush=True)  # fmt: skip
            missed += not caught
            continue
        fired = {k: v for k, v in invariants.items() if v}
        first = next((examples[i][0] for i in mutation.caught_by if examples.get(i)), "")
        print(f"{'caught' if caught else 'MISSED'}: {mutation.name}: meant for"
              f" {' or '.join(mutation.caught_by)}; the soak reported {fired or 'nothing'}"
              + (f" (e.g. {first})" if first else ""), flush=True)  # fmt: skip
        missed += not caught
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
