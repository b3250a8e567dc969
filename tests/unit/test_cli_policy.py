"""``rollbackctl policy validate|explain`` and ``rollbackctl crds``, end to end through ``main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cli.main import build_parser, main
from sim.apiserver import free_port
from tests.conftest import EXAMPLES, policy_doc
from workflows.contract import Mode


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = main(list(argv))
    return code, capsys.readouterr().out.splitlines()


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_validate_shipped_examples(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(str(p) for p in EXAMPLES.glob("*.yaml"))
    assert len(files) >= 3
    code, out = run(capsys, "policy", "validate", *files)
    assert code == 0, out
    assert out == [f"{len(files)} policies valid"]


def test_validate_reports_one_line_per_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = policy_doc(
        "RollbackPolicy",
        "broken",
        monitoringPeriod="0s",
        adoptionThresholdPercent=150,
        colour="red",
    )
    good = policy_doc("ClusterRollbackPolicy", "fine")
    path = write(tmp_path, "p.yaml", yaml.safe_dump_all([good, bad]))
    code, out = run(capsys, "policy", "validate", path)
    assert code == 1
    assert sorted(out) == sorted(
        [
            f"{path}: RollbackPolicy/broken: spec.monitoringPeriod: invalid duration '0s': "
            "expected a positive Go duration such as 90s, 5m, 1h30m",
            f"{path}: RollbackPolicy/broken: spec.adoptionThresholdPercent: "
            "Input should be less than or equal to 100",
            f"{path}: RollbackPolicy/broken: spec.colour: unknown field",
        ]
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", "no documents found", id="empty-file"),
        pytest.param("---\n---\n", "no documents found", id="only-separators"),
        pytest.param("kind: [unclosed\n", "invalid YAML: line 2", id="bad-yaml"),
        pytest.param("values:\n  - *-prod\n", "invalid YAML", id="unquoted-wildcard"),
        pytest.param(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
            "ConfigMap/c: kind: expected RollbackPolicy or ClusterRollbackPolicy",
            id="wrong-kind",
        ),
        pytest.param(
            "- a\n- b\n", "<no kind>/<document 1>: document is not a mapping", id="a-list"
        ),
        pytest.param(
            "kind: RollbackPolicy\nspec: {}\n",
            "RollbackPolicy/<document 1>: metadata: required",
            id="no-meta",
        ),
    ],
)
def test_validate_never_tracebacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = write(tmp_path, "x.yaml", text)
    code, out = run(capsys, "policy", "validate", path)
    assert code == 1
    assert any(line.startswith(f"{path}: ") and expected in line for line in out), out


def test_validate_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "policy", "validate", "/nonexistent/p.yaml")
    assert code == 1 and out[0].startswith("/nonexistent/p.yaml: cannot read:")


def test_explain_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(
        capsys,
        "policy",
        "explain",
        "--policies",
        *sorted(str(p) for p in EXAMPLES.glob("*.yaml")),
        "--workload",
        str(EXAMPLES / "workloads" / "storefront-api.yaml"),
    )
    text = "\n".join(out)
    assert code == 0
    assert "Policy:    RollbackPolicy/production/production-rollback" in text
    assert "* RollbackPolicy/production/production-rollback: selected: highest precedence" in text
    assert (
        "- ClusterRollbackPolicy/production-cluster-rollback: namespace 'production' is not In"
        in text
    )
    assert out[-3:] == [
        "  turn 1: 2m",
        "  turn 2: 4m",
        "  turn 3: 6m  -> failedPermanent when this wait ends",
    ]


def test_explain_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(
        capsys,
        "policy",
        "explain",
        "--policies",
        str(EXAMPLES / "production-rollback.yaml"),
        str(EXAMPLES / "production-cluster-rollback.yaml"),
        "--workload",
        str(EXAMPLES / "workloads" / "storefront-api.yaml"),
        "--namespace",
        "prod-eu",
        "-o",
        "json",
    )
    result = json.loads("\n".join(out))
    assert code == 0
    assert result["policy"] == {
        "kind": "ClusterRollbackPolicy",
        "namespace": None,
        "name": "production-cluster-rollback",
    }
    assert result["backoffSchedule"] == ["6m", "12m", "18m", "24m", "30m"]
    assert [(c["name"], c["matched"]) for c in result["candidates"]] == [
        ("production-rollback", False),
        ("production-cluster-rollback", True),
    ]


def test_explain_retained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = write(
        tmp_path, "w.yaml", "kind: DaemonSet\nmetadata: {name: agent, namespace: monitoring}\n"
    )
    code, out = run(
        capsys,
        "policy",
        "explain",
        "--policies",
        str(EXAMPLES / "production-rollback.yaml"),
        "--workload",
        workload,
        "-o",
        "json",
    )
    result = json.loads("\n".join(out))
    assert code == 0 and result["policy"] is None and result["backoffSchedule"] == []
    code, out = run(
        capsys,
        "policy",
        "explain",
        "--policies",
        str(EXAMPLES / "production-rollback.yaml"),
        "--workload",
        workload,
    )
    assert "none matches: the workload is retained (no monitoring, rollback or retry)" in out[1]


def test_explain_says_a_protected_namespace_is_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = {"namespaceSelector": {"operator": "NotIn", "values": ["dev-*"]}}
    policies = write(
        tmp_path,
        "p.yaml",
        yaml.safe_dump(policy_doc("ClusterRollbackPolicy", "broad", scope=scope)),
    )
    workload = write(
        tmp_path, "w.yaml", "kind: DaemonSet\nmetadata: {name: agent, namespace: kube-system}\n"
    )
    explain = ["policy", "explain", "--policies", policies, "--workload", workload]
    code, out = run(capsys, *explain)
    assert code == 0
    assert out[1] == (
        "Policy:    none: namespace 'kube-system' is protected (kube-*): no policy applies there"
        " (--protected-namespaces); the workload is retained (no monitoring, rollback or retry)"
    )
    assert (
        "  - ClusterRollbackPolicy/broad: namespace 'kube-system' is protected (kube-*)"
        in "\n".join(out)
    )
    code, out = run(capsys, *explain, "-o", "json")
    assert json.loads("\n".join(out))["protected"].startswith(
        "namespace 'kube-system' is protected"
    )
    # The same setting as the worker's and the intake's: the flag, else the environment.
    code, out = run(capsys, *explain, "--protected-namespaces", "")
    assert out[1].startswith("Policy:    ClusterRollbackPolicy/broad")
    monkeypatch.setenv("ROLLBACK_PROTECTED_NAMESPACES", "team-*")
    code, out = run(capsys, *explain)
    assert out[1].startswith("Policy:    ClusterRollbackPolicy/broad")
    code, out = run(capsys, *explain, "--protected-namespaces", "Kube")
    assert code == 1
    assert out == [
        "error: --protected-namespaces: 'Kube' is not a namespace name or pattern (lower-case"
        " letters, digits, '-' and '*', at most 63 characters)"
    ]


def test_explain_rejects_bad_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = write(tmp_path, "w.yaml", "kind: Pod\nmetadata: {name: p}\n")
    code, out = run(
        capsys,
        "policy",
        "explain",
        "--policies",
        str(EXAMPLES / "production-rollback.yaml"),
        "--workload",
        workload,
    )
    assert code == 1 and "is not a workload kind" in out[0]


def test_crds_write_matches_committed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run(capsys, "crds", "--write", str(tmp_path))
    assert code == 0
    for path in tmp_path.iterdir():
        assert path.read_text() == (EXAMPLES.parent / "crds" / path.name).read_text()


@pytest.mark.parametrize("command", [["get"], ["describe", "shop/Deployment/api"], ["versions"]])
def test_temporal_unreachable_is_one_line_not_a_traceback(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()  # nothing listens there
    assert main([*command, "--address", f"127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach Temporal at 127.0.0.1:{port}")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flag", [["--mode", "monitoring"], ["--held"]])
def test_workload_filters_are_refused_on_policies(
    flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Policies have no mode and nothing holds them: the filter is refused, not dropped."""
    assert main(["get", "policies", *flag]) == 2
    assert capsys.readouterr().err == f"error: {flag[0]} filters workloads, not policies\n"


def test_get_filters_on_every_mode_the_docs_list() -> None:
    """``cleared`` too: a run that ended so carries it as its RollbackMode."""
    for mode in Mode:
        assert build_parser().parse_args(["get", "--mode", mode.value]).mode == mode.value
