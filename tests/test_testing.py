"""The no-Spark harness (``sparkstate.testing``): same semantics as the engine, manual clocks."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest

import sparkstate as ss
from sparkstate.testing import GroupStateHarness, ManualClock

PT = ss.GroupStateTimeout.ProcessingTimeTimeout
ET = ss.GroupStateTimeout.EventTimeTimeout
NT = ss.GroupStateTimeout.NoTimeout


@dataclass
class Session:
    user: str
    events: list[str] = field(default_factory=list)
    count: int = 0


def session_func(key, values, state):
    """Open a session per user; close it after a minute without events."""
    if state.hasTimedOut:
        s = state.get
        return (key, s.count, "closed")
    s = state.getOption or Session(key)
    for v in values:
        s.events.append(v)
        s.count += 1
    state.update(s)
    state.setTimeoutDuration("1 minute")
    return (key, s.count, "open")


def counter(key, values, state):
    n = (state.getOption or 0) + sum(1 for _ in values)
    state.update(n)
    return (key, n)


def pt_harness(func=session_func, **kw):
    return GroupStateHarness(func, state_type=kw.pop("state_type", Session), timeout=PT, **kw)


# --- construction --------------------------------------------------------------------------------

def test_the_harness_rejects_a_non_callable_function():
    with pytest.raises(ss.ConfigError, match=r"^GroupStateHarness: expected a function \(key, values, state\) ->"
                                             r" output, got 'count'$"):
        GroupStateHarness("count")


def test_the_harness_rejects_an_unknown_timeout():
    with pytest.raises(ss.TimeoutConfigError, match=r"^timeout: expected one of NoTimeout, ProcessingTimeTimeout,"
                                                    r" EventTimeTimeout .* got 'processing'$"):
        GroupStateHarness(counter, state_type=int, timeout="processing")


def test_the_harness_accepts_the_timeout_as_a_string():
    assert GroupStateHarness(counter, timeout="EventTimeTimeout").timeout is ET


def test_the_harness_rejects_a_state_type_that_cannot_be_stored():
    with pytest.raises(ss.StateTypeError, match=r"^state_type: type set\[int\] cannot be stored"):
        GroupStateHarness(counter, state_type=set[int])


def test_the_harness_defaults():
    h = GroupStateHarness(counter)
    assert (h.timeout, h.keep_expired_state, h.flat) == (NT, False, False)
    assert (h.processing_time_ms, h.watermark_ms) == (0, -1)
    assert GroupStateHarness(counter, start_time_ms=5_000).processing_time_ms == 5_000


# --- feed and peek -------------------------------------------------------------------------------

def test_feed_returns_the_outputs_and_keeps_the_state_per_key():
    h = pt_harness()
    assert h.feed("u1", ["a", "b"]) == [("u1", 2, "open")]
    assert h.feed("u2", ["x"]) == [("u2", 1, "open")]
    assert h.feed("u1", ["c"]) == [("u1", 3, "open")]
    assert h.peek_state("u1") == Session("u1", ["a", "b", "c"], 3)
    assert h.peek_state("u2") == Session("u2", ["x"], 1)


def test_feed_passes_the_values_in_order_as_an_iterator_and_accepts_any_iterable():
    seen = []

    def f(key, values, state):
        assert iter(values) is values
        seen.append(list(values))

    h = GroupStateHarness(f)
    h.feed("k", (v for v in [3, 1, 2]))
    h.feed("k", [])
    assert seen == [[3, 1, 2], []]


def test_peek_state_of_an_unknown_key_is_none():
    assert pt_harness().peek_state("nobody") is None
    assert pt_harness().peek_timeout_ms("nobody") is None


def test_keys_are_those_with_state_or_a_pending_timeout():
    def f(key, values, state):
        vals = list(values)
        if vals == ["drop"]:
            state.remove()
        elif vals == ["ghost"]:
            state.remove()
            state.setTimeoutDuration(1_000)
        elif vals:
            state.update(len(vals))

    h = GroupStateHarness(f, state_type=int, timeout=PT)
    h.feed("a", [1])
    h.feed("b", [1, 2])
    h.feed("c", [])  # no state, no timeout: not kept
    h.feed("d", ["ghost"])
    assert sorted(h.keys()) == ["a", "b", "d"]
    assert h.peek_state("d") is None and h.peek_timeout_ms("d") == 1_000
    h.feed("a", ["drop"])
    assert sorted(h.keys()) == ["b", "d"]


def test_the_function_sees_the_harness_clock():
    seen = []

    def f(key, values, state):
        seen.append((state.getCurrentProcessingTimeMs(), state.getCurrentWatermarkMs()))

    h = GroupStateHarness(f, timeout=ET, start_time_ms=1_000)
    h.feed("k", [1])
    h.advance_processing_time("1 second")
    h.advance_watermark(500)
    h.feed("k", [1])
    assert seen == [(1_000, 0), (2_000, 500)]  # the watermark starts at 0, as in Spark's first batch


def test_state_goes_through_the_codec_so_peek_returns_an_equal_copy():
    h = pt_harness()
    h.feed("u1", ["a"])
    first, second = h.peek_state("u1"), h.peek_state("u1")
    assert first == second and first is not second


def test_a_state_mutated_in_place_without_update_is_not_kept():
    def f(key, values, state):
        if state.exists:
            state.get.events.extend(values)  # mutation only: no update()
            state.get.count = 99
            return state.get.count
        state.update(Session(key, list(values), 1))
        return 1

    h = GroupStateHarness(f, state_type=Session)
    h.feed("u", ["a"])
    assert h.feed("u", ["b", "c"]) == [99]
    assert h.peek_state("u") == Session("u", ["a"], 1)


def test_a_state_that_does_not_match_its_type_fails_with_the_field_named():
    def f(key, values, state):
        state.update(Session(key, events="not a list"))

    h = GroupStateHarness(f, state_type=Session)
    with pytest.raises(ss.StateTypeError, match=r"^GroupStateHarness: the state of key 'u' cannot be stored:"
                                                r" state_type\.events: expected a list, got str 'not a list'$"):
        h.feed("u", [])
    assert h.keys() == []


def test_without_a_state_type_values_are_kept_as_they_are():
    h = GroupStateHarness(counter)
    h.feed("k", [1, 2])
    assert h.peek_state("k") == 2


def test_set_state_seeds_state_as_initial_state_does():
    h = pt_harness()
    h.set_state("u1", Session("u1", ["old"], 1), timeout_ms=30_000)
    assert h.peek_timeout_ms("u1") == 30_000
    assert h.feed("u1", ["new"]) == [("u1", 2, "open")]
    assert h.peek_state("u1").events == ["old", "new"]


def test_set_state_keeps_no_timeout_without_timeouts_as_initial_state_does():
    h = GroupStateHarness(counter)
    h.set_state("k", 1, timeout_ms=30_000)
    assert (h.peek_state("k"), h.peek_timeout_ms("k")) == (1, None)


def test_set_state_with_a_timeout_fires_it():
    h = pt_harness()
    h.set_state("u1", Session("u1", ["old"], 1), timeout_ms=30_000)
    assert h.advance_processing_time(30_001) == [("u1", 1, "closed")]
    assert h.peek_state("u1") is None


# --- moving time ---------------------------------------------------------------------------------

@pytest.mark.parametrize("step", [120_000, timedelta(minutes=2), "2 minutes", "1 minute 60 seconds"])
def test_advance_processing_time_accepts_ms_timedelta_and_strings(step):
    h = pt_harness()
    h.feed("u1", ["a"])
    assert h.advance_processing_time(step) == [("u1", 1, "closed")]
    assert h.processing_time_ms == 120_000


def test_advance_processing_time_by_zero_is_allowed():
    h = pt_harness()
    assert h.advance_processing_time(0) == []
    assert h.processing_time_ms == 0


def test_processing_time_cannot_move_backwards_and_the_message_names_both_values():
    h = pt_harness(start_time_ms=61_000)
    with pytest.raises(ValueError, match=r"^processing time cannot move backwards: it is 61000 ms, asked for 60999 ms$"):
        h.advance_processing_time(-1)
    with pytest.raises(ValueError, match=r"it is 61000 ms, asked for 1000 ms$"):
        h.advance_processing_time(timedelta(minutes=-1))
    assert h.processing_time_ms == 61_000


def test_advance_processing_time_rejects_bad_durations():
    with pytest.raises(ValueError, match=r"^advance_processing_time: expected a duration such as"):
        pt_harness().advance_processing_time("a bit")


def test_the_watermark_cannot_move_backwards_and_the_message_names_both_values():
    h = GroupStateHarness(counter, state_type=int, timeout=ET)
    h.advance_watermark(120_000)
    with pytest.raises(ValueError, match=r"^the watermark cannot move backwards: it is 120000 ms, asked for 119999 ms$"):
        h.advance_watermark(119_999)
    assert h.watermark_ms == 120_000


def test_advance_watermark_to_the_same_value_is_allowed():
    h = GroupStateHarness(counter, state_type=int, timeout=ET)
    h.advance_watermark(5)
    assert h.advance_watermark(5) == []


def test_advance_watermark_accepts_a_datetime():
    h = GroupStateHarness(counter, state_type=int, timeout=ET)
    h.advance_watermark(datetime(2024, 1, 1, tzinfo=timezone.utc))
    assert h.watermark_ms == 1_704_067_200_000


def test_advance_watermark_rejects_bad_instants():
    with pytest.raises(ValueError, match=r"^advance_watermark: expected epoch milliseconds \(int\) or a datetime, got str"):
        GroupStateHarness(counter, timeout=ET).advance_watermark("noon")


# --- timeouts: strictly before ------------------------------------------------------------------------

def test_a_processing_time_timeout_at_t_fires_only_when_time_passes_t():
    h = pt_harness()
    h.feed("u1", ["a"])  # at 0: times out at 60 000
    assert h.peek_timeout_ms("u1") == 60_000
    assert h.advance_processing_time("60 seconds") == []
    assert h.peek_state("u1") is not None
    assert h.advance_processing_time(1) == [("u1", 1, "closed")]


def event_func(key, values, state):
    if state.hasTimedOut:
        return ("timeout", key, state.get)
    n = (state.getOption or 0) + len(list(values))
    state.update(n)
    state.setTimeoutTimestamp(100_000)
    return ("data", key, n)


def test_an_event_time_timeout_at_t_fires_only_when_the_watermark_passes_t():
    h = GroupStateHarness(event_func, state_type=int, timeout=ET)
    h.feed("k", [1, 2])
    assert h.advance_watermark(100_000) == []
    assert h.advance_watermark(100_001) == [("timeout", "k", 2)]
    assert h.peek_state("k") is None


def test_processing_time_does_not_fire_event_time_timeouts_and_the_watermark_does_not_fire_processing_ones():
    e = GroupStateHarness(event_func, state_type=int, timeout=ET)
    e.feed("k", [1])
    assert e.advance_processing_time("1 day") == []
    assert e.peek_state("k") == 1

    p = pt_harness()
    p.feed("u", ["a"])
    assert p.advance_watermark(10**12) == []
    assert p.peek_state("u") is not None


def test_no_timeout_harness_never_fires():
    h = GroupStateHarness(counter, state_type=int)
    h.feed("k", [1])
    assert h.advance_processing_time("1 day") == []
    assert h.advance_watermark(10**12) == []
    assert h.peek_state("k") == 1


def test_timeout_calls_get_no_values_and_has_timed_out_and_data_calls_do_not():
    calls = []

    def f(key, values, state):
        calls.append((state.hasTimedOut, list(values)))
        if not state.hasTimedOut:
            state.update(1)
            state.setTimeoutDuration(10)

    h = GroupStateHarness(f, state_type=int, timeout=PT)
    h.feed("k", ["v"])
    h.advance_processing_time(11)
    assert calls == [(False, ["v"]), (True, [])]


def test_timeouts_fire_in_timeout_order_then_key_order():
    def f(key, values, state):
        if state.hasTimedOut:
            return key
        state.update(0)
        state.setTimeoutDuration({"late": 3_000, "early": 1_000, "tie1": 2_000, "tie2": 2_000}[key])

    h = GroupStateHarness(f, state_type=int, timeout=PT)
    for k in ("late", "tie1", "early", "tie2"):
        h.feed(k, [])
    assert h.advance_processing_time(10_000) == ["early", "tie1", "tie2", "late"]
    assert h.keys() == []


def test_only_due_keys_time_out():
    h = pt_harness()
    h.feed("u1", ["a"])
    h.advance_processing_time("30 seconds")
    h.feed("u2", ["b"])  # times out at 90 000
    assert h.advance_processing_time("31 seconds") == [("u1", 1, "closed")]
    assert h.peek_state("u2") is not None
    assert h.advance_processing_time("30 seconds") == [("u2", 1, "closed")]


def test_new_data_moves_the_timeout():
    h = pt_harness()
    h.feed("u1", ["a"])
    h.advance_processing_time("50 seconds")
    h.feed("u1", ["b"])  # now times out at 110 000
    assert h.advance_processing_time("50 seconds") == []
    assert h.advance_processing_time("10 seconds 1 ms") == [("u1", 2, "closed")]


def test_a_call_that_does_not_set_the_timeout_again_clears_it():
    def f(key, values, state):
        vals = list(values)
        state.update(len(vals))
        if vals == ["arm"]:
            state.setTimeoutDuration(1_000)

    h = GroupStateHarness(f, state_type=int, timeout=PT)
    h.feed("k", ["arm"])
    assert h.peek_timeout_ms("k") == 1_000
    h.feed("k", ["x", "y"])
    assert h.peek_timeout_ms("k") is None
    h.advance_processing_time(5_000)
    assert h.peek_state("k") == 2


# --- expired state (api.md 1.3) ----------------------------------------------------------------------

def test_state_is_removed_after_a_timeout_call_that_neither_updates_nor_sets_a_timeout():
    h = pt_harness()
    h.feed("u1", ["a"])
    h.advance_processing_time("61 seconds")
    assert h.peek_state("u1") is None
    assert h.keys() == []
    assert h.advance_processing_time("1 hour") == []


def test_keep_expired_state_keeps_it_as_spark_does():
    h = pt_harness(keep_expired_state=True)
    h.feed("u1", ["a"])
    assert h.advance_processing_time("61 seconds") == [("u1", 1, "closed")]
    assert h.peek_state("u1") == Session("u1", ["a"], 1)
    assert h.peek_timeout_ms("u1") is None  # no new timeout: it does not fire again
    assert h.advance_processing_time("1 hour") == []
    assert h.feed("u1", ["b"]) == [("u1", 2, "open")]


def test_a_timeout_call_that_updates_keeps_the_state():
    def f(key, values, state):
        if state.hasTimedOut:
            state.update(state.get + 100)
            return "updated"
        state.update(1)
        state.setTimeoutDuration(1_000)

    h = GroupStateHarness(f, state_type=int, timeout=PT)
    h.feed("k", [])
    assert h.advance_processing_time(1_001) == ["updated"]
    assert h.peek_state("k") == 101
    assert h.peek_timeout_ms("k") is None


def test_a_timeout_call_that_sets_a_new_timeout_keeps_the_state_and_fires_again():
    def f(key, values, state):
        state.setTimeoutDuration(1_000)
        if state.hasTimedOut:
            return ("tick", state.get)
        state.update(7)

    h = GroupStateHarness(f, state_type=int, timeout=PT)
    h.feed("k", [])
    assert h.advance_processing_time(1_001) == [("tick", 7)]
    assert h.peek_timeout_ms("k") == 2_001
    assert h.advance_processing_time(1_001) == [("tick", 7)]
    assert h.peek_state("k") == 7


def test_a_timeout_call_that_removes_the_state_removes_it_even_with_keep_expired_state():
    def f(key, values, state):
        if state.hasTimedOut:
            state.remove()
            return "removed"
        state.update(1)
        state.setTimeoutDuration(10)

    h = GroupStateHarness(f, state_type=int, timeout=PT, keep_expired_state=True)
    h.feed("k", [])
    assert h.advance_processing_time(11) == ["removed"]
    assert h.keys() == []


def test_a_pending_timeout_without_state_still_fires_once():
    seen = []

    def f(key, values, state):
        if state.hasTimedOut:
            seen.append(state.exists)
            return "fired"
        state.remove()
        state.setTimeoutDuration(10)

    h = GroupStateHarness(f, state_type=int, timeout=PT)
    h.feed("k", [])
    assert h.advance_processing_time(11) == ["fired"]
    assert seen == [False]
    assert h.keys() == []


# --- setting timeouts through the harness ---------------------------------------------------------------

@pytest.mark.parametrize("duration", [90_000, timedelta(seconds=90), "1 minute 30 seconds", "90 seconds"])
def test_set_timeout_duration_accepts_ms_timedelta_and_strings(duration):
    def f(key, values, state):
        state.update(1)
        state.setTimeoutDuration(duration)

    h = GroupStateHarness(f, state_type=int, timeout=PT, start_time_ms=10_000)
    h.feed("k", [])
    assert h.peek_timeout_ms("k") == 100_000


def test_set_timeout_timestamp_with_a_datetime_and_additional():
    base = datetime(2024, 1, 1, tzinfo=timezone.utc)

    def f(key, values, state):
        if state.hasTimedOut:
            return "expired"
        state.update(1)
        state.setTimeoutTimestamp(base, additional="10 seconds")

    h = GroupStateHarness(f, state_type=int, timeout=ET)
    h.feed("k", [])
    assert h.peek_timeout_ms("k") == 1_704_067_210_000
    assert h.advance_watermark(base + timedelta(seconds=10)) == []
    assert h.advance_watermark(1_704_067_210_001) == ["expired"]


def test_event_time_timeout_based_on_the_watermark():
    def f(key, values, state):
        if state.hasTimedOut:
            return ("closed", key)
        state.update(1)
        state.setTimeoutTimestamp(state.getCurrentWatermarkMs(), additional=timedelta(seconds=5))

    h = GroupStateHarness(f, state_type=int, timeout=ET)
    h.advance_watermark(20_000)
    h.feed("k", [])
    assert h.peek_timeout_ms("k") == 25_000
    assert h.advance_watermark(25_001) == [("closed", "k")]


# --- misuse through the harness (api.md 1.1), with the key named -----------------------------------------

def test_get_without_state_raises_state_not_found_naming_the_key():
    with pytest.raises(ss.StateNotFoundError, match=r"^state\.get: this key has no state\. .* \(key 'u1'\)$") as info:
        GroupStateHarness(lambda k, v, s: s.get).feed("u1", [])
    assert isinstance(info.value, LookupError)


def test_update_none_raises_value_error_naming_the_key():
    with pytest.raises(ValueError, match=r"^state\.update\(None\): None cannot be stored as state; call state\.remove\(\)"
                                         r" instead\. \(key 'u1'\)$"):
        GroupStateHarness(lambda k, v, s: s.update(None)).feed("u1", [])


@pytest.mark.parametrize("timeout", [NT, ET])
def test_set_timeout_duration_without_processing_time_timeout_raises(timeout):
    h = GroupStateHarness(lambda k, v, s: s.setTimeoutDuration("1 minute"), timeout=timeout)
    with pytest.raises(ss.TimeoutConfigError, match=rf"^state\.setTimeoutDuration needs"
                                                    rf" timeout=GroupStateTimeout\.ProcessingTimeTimeout, but this query"
                                                    rf" uses {timeout.value}\..* \(key 'u1'\)$"):
        h.feed("u1", [])


@pytest.mark.parametrize(("duration", "shown"), [(0, "0 (0 ms)"), (-5, "-5 (-5 ms)"), ("0 minutes", "'0 minutes' (0 ms)")])
def test_set_timeout_duration_zero_or_negative_raises_value_error(duration, shown):
    h = GroupStateHarness(lambda k, v, s: s.setTimeoutDuration(duration), timeout=PT)
    with pytest.raises(ValueError) as info:
        h.feed("u1", [])
    assert str(info.value) == f"state.setTimeoutDuration: expected a positive duration, got {shown} (key 'u1')"


@pytest.mark.parametrize("timeout", [NT, PT])
def test_set_timeout_timestamp_without_event_time_timeout_raises(timeout):
    h = GroupStateHarness(lambda k, v, s: s.setTimeoutTimestamp(1_000), timeout=timeout)
    with pytest.raises(ss.TimeoutConfigError, match=rf"^state\.setTimeoutTimestamp needs"
                                                    rf" timeout=GroupStateTimeout\.EventTimeTimeout, but this query uses"
                                                    rf" {timeout.value}\..* \(key 'u1'\)$"):
        h.feed("u1", [])


def test_set_timeout_timestamp_earlier_than_the_watermark_names_both_values():
    h = GroupStateHarness(lambda k, v, s: s.setTimeoutTimestamp(59_000), timeout=ET)
    h.advance_watermark(60_000)
    with pytest.raises(ValueError, match=r"^Timeout timestamp \(59000, 1970-01-01 00:00:59\.000000 UTC\) cannot be earlier"
                                         r" than the current watermark \(60000, 1970-01-01 00:01:00\.000000 UTC\)\..*"
                                         r" \(key 'u1'\)$"):
        h.feed("u1", [])


def test_get_current_watermark_ms_without_a_watermark_raises():
    h = GroupStateHarness(lambda k, v, s: s.getCurrentWatermarkMs(), timeout=PT)
    with pytest.raises(ss.TimeoutConfigError, match=r"^state\.getCurrentWatermarkMs: the query defines no watermark\."
                                                    r" Call df\.withWatermark"):
        h.feed("u1", [])


def test_a_failed_call_leaves_the_state_as_it_was():
    def f(key, values, state):
        state.update(999)
        raise RuntimeError("boom")

    h = GroupStateHarness(f, state_type=int)
    h.set_state("k", 1)
    with pytest.raises(ss.UserFunctionError):
        h.feed("k", [])
    assert h.peek_state("k") == 1


def test_a_user_exception_becomes_user_function_error_naming_the_key():
    def parse(key, values, state):
        return [int(v) for v in values]

    with pytest.raises(ss.UserFunctionError, match=r"^the state function 'parse' raised ValueError: invalid literal for"
                                                   r" int\(\) with base 10: 'x' \(key \('u1', 2\)\)\. Fix the function") as info:
        GroupStateHarness(parse).feed(("u1", 2), ["1", "x"])
    assert isinstance(info.value.__cause__, ValueError)


def test_a_user_exception_in_a_timeout_call_becomes_user_function_error():
    def f(key, values, state):
        if state.hasTimedOut:
            raise KeyError("gone")
        state.update(1)
        state.setTimeoutDuration(10)

    h = GroupStateHarness(f, state_type=int, timeout=PT)
    h.feed("k", [])
    with pytest.raises(ss.UserFunctionError, match=r"raised KeyError: 'gone' \(key 'k'\)"):
        h.advance_processing_time(11)


# --- flat -------------------------------------------------------------------------------------------------

def test_flat_harness_returns_every_output_of_every_call():
    def f(key, values, state):
        if state.hasTimedOut:
            yield (key, "end")
            return
        for v in values:
            yield (key, v)
        state.update(1)
        state.setTimeoutDuration(100)

    h = GroupStateHarness(f, state_type=int, timeout=PT, flat=True)
    assert h.feed("a", [1, 2]) == [("a", 1), ("a", 2)]
    assert h.feed("b", []) == []
    assert h.advance_processing_time(101) == [("a", "end"), ("b", "end")]


def test_flat_harness_treats_none_as_no_output_and_map_harness_wraps_one_output():
    assert GroupStateHarness(lambda k, v, s: None, flat=True).feed("k", []) == []
    assert GroupStateHarness(lambda k, v, s: [1, 2]).feed("k", []) == [[1, 2]]
    assert GroupStateHarness(lambda k, v, s: None).feed("k", []) == []


# --- run_batch ------------------------------------------------------------------------------------------

def test_run_batch_calls_keys_with_data_first_then_timed_out_keys():
    h = pt_harness()
    h.run_batch({"u1": ["a"], "u2": ["b"]}, processing_time=0)
    out = h.run_batch({"u3": ["c"]}, processing_time=60_001)
    assert out == [("u3", 1, "open"), ("u1", 1, "closed"), ("u2", 1, "closed")]


def test_run_batch_a_key_with_data_does_not_time_out_in_that_batch():
    h = pt_harness()
    h.run_batch({"u1": ["a"], "u2": ["b"]}, processing_time=0)
    out = h.run_batch({"u1": ["c"]}, processing_time=120_000)
    assert out == [("u1", 2, "open"), ("u2", 1, "closed")]
    assert h.peek_state("u1") == Session("u1", ["a", "c"], 2)
    assert h.peek_timeout_ms("u1") == 180_000


def test_run_batch_moves_the_watermark_for_event_time():
    h = GroupStateHarness(event_func, state_type=int, timeout=ET)
    assert h.run_batch({"k": [1]}, watermark=50_000) == [("data", "k", 1)]
    assert h.run_batch({}, watermark=100_001) == [("timeout", "k", 1)]


def test_run_batch_rejects_time_moving_backwards():
    h = pt_harness(start_time_ms=10_000)
    with pytest.raises(ValueError, match=r"^processing time cannot move backwards: it is 10000 ms, asked for 5000 ms$"):
        h.run_batch({}, processing_time=5_000)


def test_run_batch_without_timeouts_only_calls_keys_with_data():
    h = GroupStateHarness(counter, state_type=int)
    assert h.run_batch({"a": [1], "b": [1, 1]}) == [("a", 1), ("b", 2)]
    assert h.run_batch({"a": [1]}) == [("a", 2)]


# --- ManualClock ----------------------------------------------------------------------------------------

def test_manual_clock_moves_forward_only():
    c = ManualClock(10)
    c.set(10)
    c.set(20)
    assert c.now_ms == 20
    with pytest.raises(ValueError, match=r"^event time cannot move backwards: it is 20 ms, asked for 19 ms$"):
        c.set(19, "event time")
    assert c.now_ms == 20
