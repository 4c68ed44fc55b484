"""The channel webhook state machine, decided purely: every row of the spec's table."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from inboxd.webhooks.policy import (
    DELIVERING,
    DISABLED,
    PAUSED,
    Policy,
    Result,
    UrlState,
    classify,
    decide,
    reenabled,
    wake_at,
)

S = 1_000_000
MIN = 60 * S
H = 60 * MIN
POLICY = Policy(pause_after_us=10 * MIN, probe_schedule_us=(15 * MIN, H, 6 * H))
FAIL = classify(None, "timeout")
OK = classify(200, None)


def test_classification_follows_the_spec() -> None:
    for status in (500, 502, 503, 401, 403, 404, 410, 429):
        assert classify(status, None).kind == "failure", status
    assert classify(None, "connection refused").kind == "failure"
    for status in (200, 201, 204, 299):
        assert classify(status, None).kind == "success"
    for status in (301, 302, 400, 405, 409, 413, 422):
        assert classify(status, None).kind == "other", status


def test_first_failure_keeps_delivering_and_retries_the_message() -> None:
    d = decide(UrlState(), FAIL, 0, POLICY)
    assert d.state.state == DELIVERING and not d.warn and not d.advance
    assert d.state.failure_count == 1 and d.state.first_failure_at == 0
    assert wake_at(d.state) == 10 * S


def test_second_failure_warns_once_per_episode() -> None:
    s = decide(UrlState(), FAIL, 0, POLICY).state
    second = decide(s, FAIL, 10 * S, POLICY)
    assert second.warn and second.state.state == DELIVERING and second.state.warned
    third = decide(second.state, FAIL, 40 * S, POLICY)
    assert not third.warn
    # A success ends the episode; the next episode warns again.
    s = decide(third.state, OK, 50 * S, POLICY).state
    assert s.failure_count == 0 and not s.warned and s.last_success_at == 50 * S
    s = decide(s, FAIL, 60 * S, POLICY).state
    assert decide(s, FAIL, 70 * S, POLICY).warn


def run_until_paused() -> tuple[UrlState, list[int]]:
    s, now, times = UrlState(), 0, []
    while s.state == DELIVERING:
        times.append(now)
        s = decide(s, FAIL, now, POLICY).state
        if s.state == DELIVERING:
            nxt = wake_at(s)
            assert nxt is not None
            now = nxt
    return s, times


def test_paused_at_the_first_failure_ten_minutes_into_the_episode() -> None:
    s, times = run_until_paused()
    # Retries +10 s, +30 s, +2 min, +5 min and +10 min into the episode: the last one pauses,
    # the spec's "10 minutes" (they were gaps, which paused it at 17 min 40 s).
    assert times == [0, 10 * S, 30 * S, 120 * S, 300 * S, 600 * S]
    assert s.state == PAUSED and s.paused_at == 600 * S
    assert s.next_probe_at == 600 * S + 15 * MIN
    assert wake_at(s) == s.next_probe_at


def test_a_retry_comes_pause_after_into_the_episode_whatever_pause_after_is() -> None:
    for minutes in (1, 7, 15, 45):
        policy = Policy(pause_after_us=minutes * MIN, probe_schedule_us=POLICY.probe_schedule_us)
        s, now = UrlState(), 0
        while s.state == DELIVERING:
            s = decide(s, FAIL, now, policy).state
            now = wake_at(s) or 0
        assert s.paused_at == minutes * MIN, minutes
    # Failures of later messages in the same episode retry at the episode's next time.
    s = decide(UrlState(), FAIL, 0, POLICY).state
    s = decide(s, classify(400, None), 10 * S, POLICY).state  # that message is done with
    assert decide(s, FAIL, 50 * S, POLICY).state.next_attempt_at == 120 * S


def test_probes_after_15_min_1_h_6_h_then_disabled_with_one_stopped_email() -> None:
    s, _ = run_until_paused()
    paused_at = s.paused_at
    assert paused_at is not None
    probes = []
    emails = 0
    while s.state == PAUSED:
        now = wake_at(s)
        assert now is not None
        probes.append(now - paused_at)
        d = decide(s, FAIL, now, POLICY)
        emails += d.stopped
        s = d.state
    assert probes == [15 * MIN, H, 6 * H]
    assert s.state == DISABLED and emails == 1 and s.disabled_at == paused_at + 6 * H
    assert wake_at(s) is None
    assert decide(s, OK, paused_at + 7 * H, POLICY).state == s  # nothing reaches a disabled URL


def test_each_probe_can_resume() -> None:
    for successful_probe in range(3):
        s, _ = run_until_paused()
        for _ in range(successful_probe):
            s = decide(s, FAIL, wake_at(s) or 0, POLICY).state
        d = decide(s, classify(204, None), wake_at(s) or 0, POLICY)
        assert d.state.state == DELIVERING and d.advance
        assert d.state.failure_count == 0 and d.state.paused_at is None


def test_other_statuses_are_not_failures() -> None:
    s = decide(UrlState(), FAIL, 0, POLICY).state
    d = decide(s, classify(400, None), 10 * S, POLICY)
    assert d.advance and not d.warn
    assert d.state.failure_count == 1 and d.state.state == DELIVERING  # episode untouched
    assert d.state.next_attempt_at is None


def test_a_probe_without_a_2xx_is_a_failed_check() -> None:
    """Spec: "Without a 2xx, reconfiguring the URL is the only way to resume." A 400 to a
    probe used to resume delivery (and drop the kept message)."""
    s, _ = run_until_paused()
    paused_at = s.paused_at
    assert paused_at is not None
    d = decide(s, classify(400, None), paused_at + 15 * MIN, POLICY)
    assert d.state.state == PAUSED and not d.advance  # the message stays kept
    assert d.state.probes_done == 1 and d.state.next_probe_at == paused_at + H
    assert d.state.last_status == 400 and d.state.failure_count == s.failure_count
    d = decide(d.state, classify(302, None), paused_at + H, POLICY)
    d = decide(d.state, classify(422, None), paused_at + 6 * H, POLICY)
    assert d.state.state == DISABLED and d.stopped


def test_probes_missed_while_stopped_stay_apart() -> None:
    """A daemon stopped through all three probe times probes once on its start, then keeps the
    schedule's gaps, instead of three probes at once and the URL disabled seconds later."""
    s, _ = run_until_paused()
    paused_at = s.paused_at
    assert paused_at is not None
    start = paused_at + 7 * H  # the daemon comes back
    first = decide(s, FAIL, start, POLICY).state
    assert first.state == PAUSED and first.next_probe_at == start + H - 15 * MIN
    second = decide(first, FAIL, start + H - 15 * MIN, POLICY).state
    assert second.state == PAUSED and second.next_probe_at == start + 6 * H - 15 * MIN
    assert decide(second, FAIL, start + 6 * H - 15 * MIN, POLICY).state.state == DISABLED
    # One missed, the next still ahead: that one keeps its time.
    late = decide(s, FAIL, paused_at + 20 * MIN, POLICY).state
    assert late.next_probe_at == paused_at + H


def test_saving_the_url_again_reenables_it() -> None:
    s, _ = run_until_paused()
    while s.state == PAUSED:
        s = decide(s, FAIL, wake_at(s) or 0, POLICY).state
    again = reenabled(s)
    assert again.state == DELIVERING and again.failure_count == 0 and wake_at(again) is None


@given(
    st.lists(
        st.tuples(st.sampled_from(["success", "failure", "other"]), st.integers(0, 3 * H)),
        max_size=80,
    )
)
def test_invariants_over_any_history(steps: list[tuple[str, int]]) -> None:
    s, now = UrlState(), 0
    warned_in_episode = False
    for kind, gap in steps:
        # Attempts happen when the supervisor would make them: at the deadline, or with traffic.
        deadline = wake_at(s)
        now = deadline if deadline is not None and s.state == PAUSED else now + gap
        result = Result(kind, 200 if kind == "success" else 500 if kind == "failure" else 400, None)
        before = s
        d = decide(s, result, now, POLICY)
        s = d.state
        if before.state == DISABLED:
            assert s == before and not d.advance
            continue
        if kind == "success":
            assert s.state == DELIVERING and s.failure_count == 0 and d.advance
        if s.failure_count == 0:  # the episode ended (a success)
            warned_in_episode = False
        if d.warn:
            assert not warned_in_episode and s.failure_count >= 2
            warned_in_episode = True
        if s.state == PAUSED and before.state == DELIVERING:
            assert before.first_failure_at is not None or s.failure_count == 1
            assert now - (s.first_failure_at or 0) >= POLICY.pause_after_us
        if s.state == PAUSED:
            assert s.paused_at is not None
            assert s.next_probe_at == s.paused_at + POLICY.probe_schedule_us[s.probes_done]
        assert d.stopped == (s.state == DISABLED and before.state == PAUSED)
        if s.state == DISABLED:
            assert s.probes_done == len(POLICY.probe_schedule_us)
