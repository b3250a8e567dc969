"""Each planted defect of ``bench.mutations`` still finds the code it edits: its text occurs
exactly once in its file, so a refactor cannot silently turn a mutation into a no-op (the
runner would refuse it only when the 2.5-minute soak of it starts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.mutations import MUTATIONS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.name[:48])
def test_every_edit_finds_its_anchor_once(mutation) -> None:  # type: ignore[no-untyped-def]
    for edit in mutation.edits:
        assert (ROOT / edit.path).read_text().count(edit.old) == 1, (mutation.name, edit.path)
