"""The channel webhook URL state machine (spec "Channel webhook URL delivery", CONTRACT s. 7).

Pure: ``decide(state, result, now, policy) -> Decision``. No I/O, no clock; the supervisor in
channel.py sends, calls ``decide``, and records what it says. Times are wall-clock microseconds.

::

    delivering --failure--> delivering      1st failure starts the episode; retry the same
                                            message at +10 s, +30 s, +2 m, +5 m, +10 m, ...
               --2nd failure-->             warning email (once per episode)
               --failure >= pause_after after the episode's first--> paused
    paused     --probe at paused_at + 15 m / 1 h / 6 h--> 2xx: delivering (episode over)
                                                          failure: next probe, or after the
                                                          last one: disabled + "stopped" email
    any        --2xx--> delivering, episode over
    disabled   --saved again (POST /webhook)--> delivering
"""

from __future__ import annotations

from typing import Final

import attrs

DELIVERING: Final = "delivering"
PAUSED: Final = "paused"
DISABLED: Final = "disabled"
URL_STATES: Final = (DELIVERING, PAUSED, DISABLED)

SECOND_US: Final = 1_000_000
# Head-of-line retries of a failed message (CONTRACT section 7); the last pause repeats.
RETRY_DELAYS_US: Final = tuple(s * SECOND_US for s in (10, 30, 120, 300, 600))
# A failure: no answer, or one of these statuses (spec). 5xx is a failure too.
FAILURE_STATUSES: Final = frozenset({401, 403, 404, 410, 429})


@attrs.frozen
class Policy:
    pause_after_us: int
    probe_schedule_us: tuple[int, ...]


@attrs.frozen
class UrlState:
    state: str = DELIVERING
    failure_count: int = 0
    first_failure_at: int | None = None
    last_failure_at: int | None = None
    last_status: int | None = None
    last_error: str | None = None
    last_success_at: int | None = None
    warned: bool = False
    paused_at: int | None = None
    next_probe_at: int | None = None
    probes_done: int = 0
    disabled_at: int | None = None
    next_attempt_at: int | None = None


@attrs.frozen
class Result:
    """What one POST came to."""

    kind: str  # "success" (2xx), "failure", or "other" (an answer that is neither)
    status: int | None
    error: str | None


def classify(status: int | None, error: str | None) -> Result:
    if status is None:
        return Result("failure", None, error or "no response")
    if 200 <= status < 300:
        return Result("success", status, None)
    if 500 <= status < 600 or status in FAILURE_STATUSES:
        return Result("failure", status, error or f"HTTP {status}")
    return Result("other", status, error or f"HTTP {status}")


@attrs.frozen
class Decision:
    state: UrlState
    # The message just sent is done with (delivered, or answered with a non-failure status):
    # the URL's cursor moves past it.
    advance: bool
    warn: bool = False  # send the "delivery is failing" email
    stopped: bool = False  # send the "delivery stopped" email


def wake_at(s: UrlState) -> int | None:
    """When the supervisor has something to do regardless of new messages (None: nothing)."""
    if s.state == PAUSED:
        return s.next_probe_at
    if s.state == DELIVERING:
        return s.next_attempt_at
    return None


def reenabled(s: UrlState) -> UrlState:
    """A fresh episode, delivering (also what saving the URL again does, via POST /webhook)."""
    return attrs.evolve(
        s,
        state=DELIVERING,
        failure_count=0,
        first_failure_at=None,
        warned=False,
        paused_at=None,
        next_probe_at=None,
        probes_done=0,
        disabled_at=None,
        next_attempt_at=None,
    )


def _episode_over(s: UrlState, r: Result, now: int) -> UrlState:
    return attrs.evolve(
        reenabled(s),
        last_success_at=now if r.kind == "success" else s.last_success_at,
        last_status=r.status,
        last_error=r.error,
    )


def decide(s: UrlState, r: Result, now: int, p: Policy) -> Decision:
    if s.state == DISABLED:
        return Decision(state=s, advance=False)  # nothing is sent to a disabled URL
    if r.kind == "success":
        return Decision(state=_episode_over(s, r, now), advance=True)
    if r.kind == "other":
        if s.state == PAUSED:
            # The URL answers (e.g. 400 to this message): it is reachable again, so delivery
            # resumes; the message itself is not retried.
            return Decision(state=_episode_over(s, r, now), advance=True)
        # Not a failure: the message's delivery ends and the URL's state is left alone.
        return Decision(state=attrs.evolve(s, next_attempt_at=None), advance=True)
    failed = attrs.evolve(
        s,
        failure_count=s.failure_count + 1,
        first_failure_at=s.first_failure_at if s.failure_count else now,
        last_failure_at=now,
        last_status=r.status,
        last_error=r.error,
    )
    if s.state == PAUSED:
        probes = s.probes_done + 1
        if probes >= len(p.probe_schedule_us):
            disabled = attrs.evolve(
                failed, state=DISABLED, probes_done=probes, next_probe_at=None, disabled_at=now
            )
            return Decision(state=disabled, advance=False, stopped=True)
        assert s.paused_at is not None
        return Decision(
            state=attrs.evolve(
                failed,
                probes_done=probes,
                next_probe_at=s.paused_at + p.probe_schedule_us[probes],
            ),
            advance=False,
        )
    warn = failed.failure_count >= 2 and not s.warned
    assert failed.first_failure_at is not None
    if now - failed.first_failure_at >= p.pause_after_us:
        paused = attrs.evolve(
            failed,
            state=PAUSED,
            warned=s.warned or warn,
            paused_at=now,
            probes_done=0,
            next_probe_at=now + p.probe_schedule_us[0],
            next_attempt_at=None,
        )
        return Decision(state=paused, advance=False, warn=warn)
    delay = RETRY_DELAYS_US[min(failed.failure_count, len(RETRY_DELAYS_US)) - 1]
    return Decision(
        state=attrs.evolve(failed, warned=s.warned or warn, next_attempt_at=now + delay),
        advance=False,
        warn=warn,
    )
