"""``python -m bench.mutations [NAME ...]``: does the soak catch what it claims to? Each mutation
puts a known defect into a copy of the product (a git worktree of HEAD, texts replaced), runs
a one-cluster soak of 100 workloads there (on a cluster whose engine actuates in place for a
defect only in-place work can show), and checks that the invariant meant
for that defect fires. Prints a line per mutation and exits 1 if any was missed.
About 2 minutes a mutation; run alone, not in CI."""

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


def _one(name: str, path: str, old: str, new: str, *caught_by: str) -> Mutation:
    return Mutation(name, (Edit(path, old, new),), caught_by)


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
        "                    input.owner, wanted, read_first=False, held=self._record_gate(input)\n"
        "                )\n",
        '            before = (self.lookup.get(input.owner) or {}).get("metadata") or {}\n'
        "            try:\n"
        "                obj, written = self.writer.patch_annotations(\n"
        "                    input.owner, wanted, read_first=False, held=self._record_gate(input)\n"
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
    """Soak a copy of HEAD with ``mutation`` in it: (caught, invariants, examples)."""
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
            actuation = "in-place" if mutation.in_place else "annotations"
            out = subprocess.run(
                [sys.executable, "-c", SOAK, actuation], cwd=tree, capture_output=True, text=True,
                env={**os.environ, "PYTHONPATH": str(tree)}, check=False, timeout=900,
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
        fired = {k: v for k, v in invariants.items() if v}
        first = next((examples[i][0] for i in mutation.caught_by if examples.get(i)), "")
        print(f"{'caught' if caught else 'MISSED'}: {mutation.name}: meant for"
              f" {' or '.join(mutation.caught_by)}; the soak reported {fired or 'nothing'}"
              + (f" (e.g. {first})" if first else ""), flush=True)  # fmt: skip
        missed += not caught
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
