"""``rollbackctl completion``: the script completes commands and flags in a real bash."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = "source <({python} -m cli.main completion bash)"


def complete(*words: str) -> list[str]:
    """What bash offers after ``rollbackctl <words>`` (the last word being typed)."""
    line = " ".join(["rollbackctl", *words])
    program = "; ".join(
        [
            SCRIPT.format(python=sys.executable),
            f"COMP_WORDS=(rollbackctl {' '.join(words)})",
            f"COMP_CWORD={len(words)}",
            f"COMP_LINE='{line}'",
            f"COMP_POINT={len(line)}",
            "_shtab_rollbackctl",
            'printf "%s\\n" "${COMPREPLY[@]}"',
        ]
    )
    out = subprocess.run(
        ["bash", "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_commands_and_flags() -> None:
    assert complete("ge") == ["get"]
    assert {"describe", "cancel", "reopen", "completion"} <= set(complete(""))
    assert {"-o", "--output", "-w", "--watch", "-A", "-n"} <= set(complete("get", "-"))
    assert complete("get", "pol") == ["policies"]


def test_zsh_script_is_generated() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "completion", "zsh"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.startswith("#compdef rollbackctl")
