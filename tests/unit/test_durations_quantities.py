from datetime import timedelta

import pytest

from workflows.durations import format_duration, parse_duration
from workflows.quantities import canonical_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("90s", timedelta(seconds=90), id="seconds"),
        pytest.param("5m", timedelta(minutes=5), id="minutes"),
        pytest.param("1h30m", timedelta(minutes=90), id="compound"),
        pytest.param("2s", timedelta(seconds=2), id="short-test-window"),
        pytest.param("1.5h", timedelta(minutes=90), id="fraction"),
        pytest.param("0m30s", timedelta(seconds=30), id="zero-component-ok"),
        pytest.param("250ms", timedelta(milliseconds=250), id="milliseconds"),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text",
    ["0s", "0", "0m0s", "-5m", "5", "", "abc", "5 m", "1d", "1ns", "m5", "1.h"],
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(seconds=90), "1m30s"),
        (timedelta(hours=2), "2h"),
        (timedelta(minutes=90), "1h30m"),
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(seconds=2, milliseconds=500), "2.5s"),
    ],
)
def test_format_duration_round_trips(value: timedelta, text: str) -> None:
    assert format_duration(value) == text
    assert parse_duration(text) == value


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param("250m", "0.25", id="cpu-milli-vs-decimal"),
        pytest.param("1Gi", "1024Mi", id="memory-binary"),
        pytest.param("1", "1000m", id="cpu-one-core"),
        pytest.param("1k", "1e3", id="decimal-exponent"),
        pytest.param("1.50", "1.5", id="trailing-zero"),
    ],
)
def test_equal_quantities_canonicalise_equal(a: str, b: str) -> None:
    assert canonical_quantity(a) == canonical_quantity(b)


def test_different_quantities_differ() -> None:
    assert canonical_quantity("1G") != canonical_quantity("1Gi")
    assert canonical_quantity("1Gi") == "1073741824"
    assert canonical_quantity("250m") == "0.25"


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "-1", "5Xi", "1 Gi"])
def test_bad_quantities_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="invalid resource quantity"):
        canonical_quantity(text)
