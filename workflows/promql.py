"""The PromQL of a policy's own health checks (``spec.healthChecks.queries[].promql``): the
variables it may name and where they may stand, the bounds a query is refused above before it is
parsed, and the tenancy rule of a ``RollbackPolicy``.

Called by the policy models (``workflows.policy``), so the intake, ``rollbackctl policy
validate`` and the worker judge every query alike, and by ``activities.health``, which fills in
the variables of the query it runs. The README's health checks page ("Tenancy", "Bounds") states
these rules. Pure: the parser, nothing that does I/O.

Two rules keep a tenant's query inside its namespace, each decided on what will run:

- a variable stands only where a value goes: inside quotes (a matcher's value, a string
  argument) or, for ``$window``, as a range or an offset (``[$window]``, ``[$window:1m]``,
  ``offset $window``); anywhere else it would change the query's shape once replaced
  (``or $namespace`` becomes ``or shop``, a selector of every namespace), so it is refused;
- the query is filled in with a sentinel namespace that no namespace can be named (it has a
  dot) and parsed, and every vector selector of that tree, in every ``or`` branch of its braces
  and in every subquery, must carry ``namespace="<sentinel>"`` (or the policy's own namespace
  written out). Anything the walk does not know is refused, not passed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import promql_parser

PROMQL_MAX = 4096  # characters of one custom query
# Refused before parsing: the parser's time grows with the tree's depth faster than linearly
# (4,080 characters of unary minus took 4 s here), and the models judge every policy the intake
# sees. A real SLO query nests a few levels and joins a handful of terms.
PROMQL_DEPTH_MAX = 32  # brackets open at once: ( [ {
PROMQL_OPERATORS_MAX = 64  # binary and unary operators, set operators and comparisons

# What a custom query may name, each replaced when it runs: the workload's namespace, its
# name, a regular expression matching exactly its cohort's pods' names (``a|b``), and the
# window's length as PromQL writes it. The values here are examples, to parse with.
PROMQL_VARIABLES = {
    "$namespace": "shop",
    "$owner": "api",
    "$pods": "api-7d9f8-x2b4q|api-7d9f8-k9m2z",
    "$window": "5m",
}
NAMESPACE_LABEL = "namespace"  # the label cAdvisor and kube-state-metrics name a namespace with
# What ``$namespace`` becomes for the tenancy check: not a namespace name (a dot), so a query
# can only match it through the variable, never through a namespace that exists.
SENTINEL_NAMESPACE = "tenancy.sentinel"
# Functions that read series their selectors do not name: ``info`` joins ``target_info``.
READS_BEYOND_SELECTORS = frozenset({"info"})

_VARIABLE = re.compile(r"\$\w*")
_WORD = re.compile(r"[A-Za-z_]\w*")
_KEYWORD_OPERATORS = frozenset({"and", "or", "unless", "atan2"})
_SYMBOL_OPERATORS = "+-*/%^<>=!"
CLOSERS = {"(": ")", "[": "]", "{": "}"}


def strings(text: str) -> tuple[list[bool], bool]:
    """For each character of ``text``, whether it lies inside a string (its quotes and escapes
    included; PromQL's three quotes, a backtick's raw), and whether ``text`` ends inside one."""
    inside: list[bool] = []
    quote: str | None = None
    escaped = False
    for char in text:
        inside.append(quote is not None or char in "\"'`")
        if quote is None:
            quote = char if char in "\"'`" else None
        elif escaped:
            escaped = False
        elif char == "\\" and quote != "`":
            escaped = True
        elif char == quote:
            quote = None
    return inside, quote is not None


def code_of(text: str, blank: str = " ") -> str:
    """``text`` with every character inside a string replaced by ``blank``: what is left is
    the query's code, column for column."""
    inside, _ = strings(text)
    return "".join(blank if q else c for c, q in zip(text, inside, strict=True))


def check_bounds(text: str) -> None:
    """A ValueError when ``text`` nests deeper than ``PROMQL_DEPTH_MAX`` brackets or has more than
    ``PROMQL_OPERATORS_MAX`` operators: cheap (one pass), so it runs before the parser does."""
    depth, operators, previous = 0, 0, ""
    code = code_of(text)
    selecting = 0  # inside a selector's braces or a range's brackets: matchers, durations
    for column, char in enumerate(code, start=1):
        if char in CLOSERS:
            depth += 1
            selecting += char != "("
            if depth > PROMQL_DEPTH_MAX:
                raise ValueError(
                    f"nests more than {PROMQL_DEPTH_MAX} brackets deep (at column {column});"
                    f" at most {PROMQL_DEPTH_MAX} are taken"
                )
        elif char in CLOSERS.values():
            depth = max(depth - 1, 0)
            selecting = max(selecting - (char != ")"), 0)
        elif not selecting and char in _SYMBOL_OPERATORS:
            # each sign of a unary run counts; == != <= >= are one; a number's exponent is none
            second = char == "=" and previous[-1:] in ("=", "!", "<", ">")
            operators += not second and not (char in "+-" and _exponent(previous))
        previous = (previous + char)[-3:]
    operators += sum(w in _KEYWORD_OPERATORS for w in _WORD.findall(_outside_selectors(code)))
    if operators > PROMQL_OPERATORS_MAX:
        raise ValueError(f"has {operators} operators; at most {PROMQL_OPERATORS_MAX} are taken")


def _outside_selectors(code: str) -> str:
    """``code`` without what its braces and square brackets hold (matchers, durations)."""
    return re.sub(r"\{[^{}]*\}|\[[^\[\]]*\]", " ", code)


def _exponent(before: str) -> bool:
    """Whether a sign after ``before`` is a number's exponent's (``1e-3``)."""
    return len(before) >= 2 and before[-1] in "eE" and before[-2].isdigit()


def check_variables(text: str) -> None:
    """A ValueError naming the first variable of ``text`` that stands where no value goes (see
    the module's docstring); variables inside quotes are values wherever they are."""
    code = code_of(text, "\0")
    for found in _VARIABLE.finditer(code):
        name, column = found.group(), found.start() + 1
        if name == "$window" and _duration_position(code, found.start(), found.end()):
            continue
        raise ValueError(
            f"{name or '$'} at column {column} stands where no value goes: a variable is taken"
            ' inside quotes (namespace="$namespace", pod=~"$pods") and $window as a range or'
            " an offset ([$window], offset $window), nowhere else"
        )


def _duration_position(code: str, start: int, end: int) -> bool:
    before, after = code[:start].rstrip(), code[end:].lstrip()
    if re.search(r"(^|[^\w])offset$", before):
        return True
    opened = [c for c in before if c in "[]"]
    in_range = bool(opened) and opened[-1] == "["
    return in_range and before[-1:] in ("[", ":") and after[:1] in ("]", ":")


def fill_promql(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each variable (``PROMQL_VARIABLES``' names) replaced by its value."""
    for name in PROMQL_VARIABLES:
        text = text.replace(name, values[name])
    return text


def parse(text: str, values: Mapping[str, str] = PROMQL_VARIABLES) -> Any:
    """``text`` within its bounds, its variables where values go, filled in with ``values`` and
    parsed; else a ValueError saying why and where."""
    check_bounds(text)
    check_variables(text)
    try:
        return promql_parser.parse(fill_promql(text, values))
    except ValueError as exc:
        raise ValueError(f"not valid PromQL: {exc}{_where(text)}") from None


def valid_promql(text: str) -> str:
    """``text`` if it is a query the engine takes (``parse``); else a ValueError."""
    parse(text)
    return text


_CHILDREN = {
    promql_parser.AggregateExpr: ("expr", "param"),
    promql_parser.BinaryExpr: ("lhs", "rhs"),
    promql_parser.Call: ("args",),
    promql_parser.MatrixSelector: ("vector_selector",),
    promql_parser.ParenExpr: ("expr",),
    promql_parser.SubqueryExpr: ("expr",),
    promql_parser.UnaryExpr: ("expr",),
    promql_parser.VectorSelector: (),
    promql_parser.NumberLiteral: (),
    promql_parser.StringLiteral: (),
}


def nodes(expr: Any) -> Iterator[Any]:
    """Every node of a parsed query, once each, in linear time (the parser's own ``walk`` took
    time cubic in the depth); a ValueError for a kind of node this module does not know."""
    stack = [expr]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        fields = _CHILDREN.get(type(node))
        if fields is None:
            raise ValueError(f"a {type(node).__name__} expression, which this check does not know")
        yield node
        for field in fields:
            child = getattr(node, field)
            stack.extend(child if isinstance(child, list) else [child])


def unconfined_selectors(text: str, namespace: str | None) -> list[str]:
    """What in ``text`` may read outside ``namespace`` (prom-label-proxy's rule, enforced rather
    than injected; the module's docstring): each offender with why, empty when the query is
    confined. A query that is not valid is an offender too (``parse`` says why)."""
    values = {**PROMQL_VARIABLES, "$namespace": SENTINEL_NAMESPACE}
    try:
        tree = list(nodes(parse(text, values)))
    except ValueError as exc:
        return [str(exc)]
    allowed = {SENTINEL_NAMESPACE} | ({namespace} if namespace else set())
    found: list[str] = []
    for node in tree:
        if isinstance(node, promql_parser.Call) and node.func.name in READS_BEYOND_SELECTORS:
            found.append(f"{node.func.name}() reads series beyond its selectors")
        if not isinstance(node, promql_parser.VectorSelector):
            continue
        branches = node.matchers.or_matchers or [node.matchers.matchers]
        if all(any(_names(m, allowed) for m in branch) for branch in branches):
            continue  # every branch reads this namespace alone (a further matcher only narrows)
        others = sorted(
            _as_written(m)
            for branch in branches
            for m in branch
            if m.name == NAMESPACE_LABEL and not _names(m, allowed)
        )
        why = f"names {', '.join(others)}" if others else 'has no namespace="$namespace" matcher'
        found.append(f"{node.name or 'a selector'} {why}")
    return found


def _names(matcher: Any, allowed: set[str]) -> bool:
    equal = matcher.op == promql_parser.MatchOp.Equal
    return bool(matcher.name == NAMESPACE_LABEL and equal and matcher.value in allowed)


def _as_written(matcher: Any) -> str:
    """A matcher as the query wrote it: the sentinel shown as ``$namespace`` again."""
    return str(matcher).replace(SENTINEL_NAMESPACE, "$namespace")


# --- where a query that does not parse goes wrong ---------------------------------------------

TOKEN_ENDS = frozenset(" \t\n+-*/%^=!<>,()[]{}")  # where a token may end: before one of these
WHERE_TRIES = 64


def _brackets(query: str) -> tuple[list[tuple[str, int]], str | None, bool]:
    """The brackets ``query`` leaves open (with their columns), the first one that closes
    nothing (as a message), and whether it ends inside a string."""
    opened: list[tuple[str, int]] = []
    inside, ends_quoted = strings(query)
    for column, (char, quoted) in enumerate(zip(query, inside, strict=True), start=1):
        if quoted:
            continue
        if char in CLOSERS:
            opened.append((char, column))
        elif char in CLOSERS.values():
            if not opened or CLOSERS[opened[-1][0]] != char:
                return opened, f" (at column {column}: {char!r} closes nothing)", False
            opened.pop()
    return opened, None, ends_quoted


def _where(query: str) -> str:
    """Where a query that does not parse goes wrong: a bracket that closes nothing or is never
    closed, else the end of its longest beginning that parses once its open brackets are
    closed (``valid up to column N``)."""
    opened, problem, _ = _brackets(query)
    if problem is not None:
        return problem
    if opened:
        return f" (at column {opened[-1][1]}: {opened[-1][0]!r} is never closed)"
    # At most WHERE_TRIES token ends, from the last: each try parses, and the models judge every
    # policy the intake sees (a 4,096-character query tried at every character took a second).
    ends = [e for e in range(len(query) - 1, 0, -1) if query[e] in TOKEN_ENDS]
    for end in ends[:WHERE_TRIES]:
        head = query[:end]
        opened, problem, quoted = _brackets(head)
        if problem is not None or quoted or not head.strip():
            continue
        try:
            closed = head + "".join(CLOSERS[c] for c, _ in reversed(opened))
            promql_parser.parse(fill_promql(closed, PROMQL_VARIABLES))
        except ValueError:
            continue
        return f" (valid up to column {len(head.rstrip())})"
    return ""  # not within the last WHERE_TRIES tokens: the parser's reason alone
