"""The simulated kubelet's restart backoff (``sim.backoff``), against the delays the real
kubelet's ``flowcontrol.Backoff`` gives a crashing container."""

from sim.backoff import INITIAL, MOST, RestartBackoff


def _crash_loop(backoff: RestartBackoff, key: str, exits: int) -> list[float]:
    """The waits before each restart of a container that crashes as soon as it starts."""
    waits, now = [], 0.0
    for _ in range(exits):
        exited = now
        wait = backoff.delay(key, exited, now)
        waits.append(wait)
        now = exited + wait
        backoff.started(key, exited, now)
    return waits


def test_the_first_exit_restarts_at_once_then_the_wait_doubles_to_five_minutes() -> None:
    assert _crash_loop(RestartBackoff(), "uid/app/{}", 9) == [
        0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0, 300.0,
    ]  # fmt: skip
    assert (INITIAL, MOST) == (10.0, 300.0)


def test_the_wait_counts_from_the_exit() -> None:
    backoff, key = RestartBackoff(), "uid/app/{}"
    backoff.started(key, exited=0.0, now=0.0)
    assert backoff.delay(key, exited=5.0, now=8.0) == 7.0
    assert backoff.delay(key, exited=5.0, now=15.0) == 0.0


def test_a_resize_starts_the_backoff_over_as_its_key_holds_the_resources() -> None:
    backoff = RestartBackoff()
    small = backoff.key("uid", "app", {"limits": {"memory": "256Mi"}})
    _crash_loop(backoff, small, 5)  # waited 10+20+40+80 s; the next wait is 160 s
    assert backoff.delay(small, exited=150.0, now=150.0) == 160.0
    big = backoff.key("uid", "app", {"limits": {"memory": "1Gi"}})
    assert big != small
    assert backoff.delay(big, exited=1000.0, now=1000.0) == 0.0


def test_ten_minutes_running_makes_the_next_crash_a_first_one() -> None:
    backoff, key = RestartBackoff(), "uid/app/{}"
    _crash_loop(backoff, key, 6)  # the next wait would be 300 s
    last_start = 10.0 + 20 + 40 + 80 + 160
    assert backoff.delay(key, exited=last_start + 60, now=last_start + 60) > 0
    assert backoff.delay(key, exited=last_start + 601, now=last_start + 601) == 0.0
