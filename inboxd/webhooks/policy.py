"""The channel webhook URL state machine (spec "Channel webhook URL delivery", CONTRACT s. 7).

Pure: ``decide(state, result, now, policy) -> Decision``. No I/O, no clock; the supervisor in
channel.py sends, calls ``decide``, and records what it says. Times are wall-clock microseconds.

::

    delivering --failure--> delivering      1st failure starts the episode; retry the same
                                            message +10 s, +30 s, +2 m, +5 m, +10 m and
                                            pause_after into the episode
               --2nd failure-->             warning email (once per episode)
               --failure >= pause_after after the episode's first--> paused
    paused     --probe at paused_at + 15 m / 1 h / 6 h--> 2xx: delivering (episode over)
                                                          anything else: next probe, or after
                                                          the last one: disabled + "stopped"
                                                          email
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
# Head-of-line retries of a failed message (CONTRACT section 7), counted from the failure
# episode's first failure; one more comes pause_after into the episode (the same as +10 m with
# the default), so that a URL failing throughout is paused then: the spec's "10 minutes".
RETRY_OFFSETS_US: Final = tuple(s * SECOND_US for s in (10, 30, 120, 300, 600))
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


def _check_failed(s: UrlState, after: UrlState, now: int, p: Policy) -> Decision:
    """A probe of a paused URL came back without a 2xx: the next probe, or after the last one
    the URL is disabled. ``after`` is ``s`` with the answer recorded."""
    probes = s.probes_done + 1
    schedule = p.probe_schedule_us
    if probes >= len(schedule):
        disabled = attrs.evolve(
            after, state=DISABLED, probes_done=probes, next_probe_at=None, disabled_at=now
        )
        return Decision(state=disabled, advance=False, stopped=True)
    assert s.paused_at is not None
    next_probe = s.paused_at + schedule[probes]
    if next_probe <= now:
        # Its time passed while the daemon was stopped: the checks stay apart as scheduled
        # instead of all going out at once on the start (and disabling the URL seconds later).
        next_probe = now + schedule[probes] - schedule[probes - 1]
    return Decision(
        state=attrs.evolve(after, probes_done=probes, next_probe_at=next_probe), advance=False
    )


def _next_attempt(first_failure_at: int, now: int, p: Policy) -> int:
    """When a failed message is tried again: the first retry time of the episode after now
    (there is always one: pause_after into the episode, which has not come yet)."""
    times = [first_failure_at + o for o in (*RETRY_OFFSETS_US, p.pause_after_us)]
    return min(t for t in times if t > now)


def decide(s: UrlState, r: Result, now: int, p: Policy) -> Decision:
    if s.state == DISABLED:
        return Decision(state=s, advance=False)  # nothing is sent to a disabled URL
    if r.kind == "success":
        return Decision(state=_episode_over(s, r, now), advance=True)
    if r.kind == "other":
        if s.state == PAUSED:
            # Not a failure, but not a 2xx either (e.g. 400 to the kept message): the check
            # failed ("without a 2xx, reconfiguring the URL is the only way to resume"), and
            # the message stays kept for the next one.
            answered = attrs.evolve(s, last_status=r.status, last_error=r.error)
            return _check_failed(s, answered, now, p)
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
        return _check_failed(s, failed, now, p)
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
    retry = _next_attempt(failed.first_failure_at, now, p)
    return Decision(
        state=attrs.evolve(failed, warned=s.warned or warn, next_attempt_at=retry),
        advance=False,
        warn=warn,
    )
