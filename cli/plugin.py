"""``kubectl rollback ...``: the engine's commands as a kubectl plugin (``kubectl-rollback``, an
executable installed with the package: kubectl finds it on the PATH), in kubectl's words and
with its conventions, each translated to the ``rollbackctl`` command that does it:

    kubectl rollback get [pauses] [-n NS | -A] [-l SELECTOR] [-o wide|json|yaml|name] [-w]
    kubectl rollback describe KIND/NAME [-n NS]      rollbackctl describe NS/KIND/NAME
    kubectl rollback history KIND/NAME [-n NS]       rollbackctl history NS/KIND/NAME
    kubectl rollback abort KIND/NAME [-n NS]         rollbackctl cancel NS/KIND/NAME
    kubectl rollback retry KIND/NAME [-n NS]         rollbackctl reopen NS/KIND/NAME
    kubectl rollback pause TARGET [-n NS] [--until T] [--reason R]
    kubectl rollback resume TARGET [-n NS]
    kubectl rollback automation [on|off] [--reason R]   the cluster's kill switch
    kubectl rollback breaker [reset]                     the storm breaker

``KIND/NAME`` may also be written ``KIND NAME``, the kind as kubectl takes it (``deploy``,
``deployments``, ...). ``-n`` defaults to the kubeconfig context's namespace, as kubectl's; ``get``
without ``-n`` or ``-A`` lists that namespace. ``abort`` and ``retry`` are Argo Rollouts' words
for ``cancel`` and ``reopen``. Every other flag (``--context``, ``--kubeconfig``, ``--address``,
``--cluster``, ...) is passed on as given.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from cli.localrun import context_namespace
from cli.main import build_parser
from cli.main import entry as rollbackctl

# The plugin's words -> rollbackctl's.
COMMANDS = {
    "get": "get",
    "describe": "describe",
    "history": "history",
    "abort": "cancel",
    "retry": "reopen",
    "pause": "pause",
    "resume": "resume",
    "automation": "automation",
    "breaker": "breaker",
}
ON_A_WORKLOAD = ("describe", "history", "abort", "retry")
USAGE = "usage: kubectl rollback {" + ",".join(COMMANDS) + "} ... (kubectl rollback COMMAND -h)"
# `kubectl rollback --help`: the commands as this module's docstring lists them.
HELP = "\n".join(
    [USAGE, "", *(line for line in (__doc__ or "").splitlines() if line.startswith("    kubectl"))]
)


def _valued(command: str) -> set[str]:
    """The flags of ``rollbackctl command`` that take a value (the token after one is not a
    positional argument)."""
    sub = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices[command]
    return {flag for a in sub._actions if a.nargs != 0 for flag in a.option_strings}


def _positionals(args: list[str], valued: set[str]) -> list[int]:
    """The indexes of the positional arguments among ``args``."""
    found, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = arg in valued  # --flag VALUE (not --flag=VALUE)
        else:
            found.append(i)
    return found


def translate(argv: Sequence[str], env_kubeconfig: str | None = None) -> list[str]:
    """``kubectl rollback`` arguments -> ``rollbackctl`` arguments (``SystemExit`` with the
    usage on a command it does not know)."""
    if not argv or argv[0] not in COMMANDS:
        raise SystemExit(f"{USAGE}\nerror: unknown command {argv[0] if argv else '(none)'!r}")
    command, target = argv[0], COMMANDS[argv[0]]
    if any(a in ("-h", "--help") for a in argv[1:]):
        return [target, "--help"]
    scope = argparse.ArgumentParser(add_help=False)
    scope.add_argument("-n", "--namespace")
    scope.add_argument("-A", "--all-namespaces", action="store_true")
    scope.add_argument("--kubeconfig")
    scope.add_argument("--context")
    known, rest = scope.parse_known_args(argv[1:])
    namespace = known.namespace or context_namespace(
        known.kubeconfig or env_kubeconfig, known.context
    )
    kube = [
        *(["--kubeconfig", known.kubeconfig] if known.kubeconfig else []),
        *(["--context", known.context] if known.context else []),
    ]
    if command in ("automation", "breaker"):  # the whole cluster's: no namespace
        return [target, *rest, *kube]
    if command == "get":
        return ["get", "-A" if known.all_namespaces else f"--namespace={namespace}", *rest, *kube]
    at = _positionals(rest, _valued(target))
    if len(at) == 2 and "/" not in rest[at[0]]:  # KIND NAME, as kubectl takes it too
        rest[at[0]] = f"{rest[at[0]]}/{rest.pop(at[1])}"
        at = at[:1]
    if command not in ON_A_WORKLOAD:  # pause, resume: they take -n themselves
        return [target, *rest, f"--namespace={namespace}", *kube]
    if len(at) == 1 and rest[at[0]].count("/") == 1:
        rest[at[0]] = f"{namespace}/{rest[at[0]]}"
    # cancel and reopen only talk to Temporal: no cluster flags to pass on.
    return [target, *rest, *(kube if target in ("describe", "history") else [])]


def entry() -> None:
    """The ``kubectl-rollback`` executable."""
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(HELP)
        return
    rollbackctl(translate(sys.argv[1:], os.environ.get("KUBECONFIG")))
