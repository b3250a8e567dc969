"""Reading policy and workload manifests from YAML files, with one readable line per problem.

Used by ``rollbackctl policy validate`` and ``rollbackctl policy explain``. Nothing here raises
on bad input: a file that cannot be read, YAML that does not parse, a document of the wrong kind
and every field error come back as ``Problem`` lines ``FILE: Kind/name: field.path: reason``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from workflows.policy import POLICY_KINDS, AnyPolicy, field_path, field_reason


@dataclass(frozen=True)
class Problem:
    file: str
    subject: str
    path: str
    reason: str

    def __str__(self) -> str:
        parts = [self.file, self.subject, self.path, self.reason]
        return ": ".join(p for p in parts if p)


MAX_FILE_BYTES = 4 * 1024 * 1024  # far above any policy file; the API server's limit is 1.5 MiB


def load_documents(path: str) -> tuple[list[tuple[int, Any]], list[Problem]]:
    """Non-empty YAML documents of ``path`` with their 1-based index, or the problem reading it."""
    try:
        if Path(path).stat().st_size > MAX_FILE_BYTES:
            return [], [Problem(path, "", "", f"larger than {MAX_FILE_BYTES} bytes")]
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [], [Problem(path, "", "", f"cannot read: {exc}")]
    try:
        docs = [d for d in yaml.safe_load_all(text)]
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f"line {where.line + 1}: " if where is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        return [], [Problem(path, "", "", f"invalid YAML: {line}{problem}")]
    except RecursionError:
        return [], [Problem(path, "", "", "invalid YAML: nested too deeply")]
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        return [], [Problem(path, "", "", f"invalid YAML: {str(exc)[:200]}")]
    numbered = [(i, d) for i, d in enumerate(docs, start=1) if d is not None]
    if not numbered:
        return [], [Problem(path, "", "", "no documents found")]
    return numbered, []


def _subject(doc: Any, index: int) -> str:
    kind = doc.get("kind") if isinstance(doc, dict) else None
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{kind or '<no kind>'}/{name or f'<document {index}>'}"


def parse_policy(doc: Any, file: str, index: int) -> tuple[AnyPolicy | None, list[Problem]]:
    subject = _subject(doc, index)
    if not isinstance(doc, dict):
        return None, [Problem(file, subject, "", "document is not a mapping")]
    model = POLICY_KINDS.get(doc.get("kind"))  # type: ignore[arg-type]
    if model is None:
        expected = " or ".join(POLICY_KINDS)
        return None, [Problem(file, subject, "kind", f"expected {expected}")]
    try:
        return model.model_validate(doc), []
    except ValidationError as exc:
        return None, [
            Problem(file, subject, field_path(e["loc"]), field_reason(e)) for e in exc.errors()
        ]
    except RecursionError:
        return None, [Problem(file, subject, "", "nested too deeply")]


def load_policies(paths: list[str]) -> tuple[list[AnyPolicy], list[Problem]]:
    policies: list[AnyPolicy] = []
    problems: list[Problem] = []
    for path in paths:
        docs, read_problems = load_documents(path)
        problems += read_problems
        for index, doc in docs:
            policy, doc_problems = parse_policy(doc, path, index)
            problems += doc_problems
            if policy is not None:
                policies.append(policy)
    return policies, problems
