"""The per-key state handle and the rules for timeouts and expiry (``sparkstate.group_state``).

Every misuse listed in api.md 1.1 is matched against its message here. Also: the error
hierarchy of api.md 6, and the ``StateSpec`` builder of ``map_with_state`` (``ss.State``'s spec).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

import sparkstate as ss
from sparkstate.engines.rules import Outcome, initial_timeout, is_due, run_call, timer_for
from sparkstate.group_state import NO_WATERMARK, GroupState, State

PT = ss.GroupStateTimeout.ProcessingTimeTimeout
ET = ss.GroupStateTimeout.EventTimeTimeout
NT = ss.GroupStateTimeout.NoTimeout


def event_state(watermark_ms=10_000, **kw):
    return GroupState(ET, watermark_ms=watermark_ms, has_watermark=True, **kw)


# --- errors (api.md 6) -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (ss.TimeoutConfigError, None),
        (ss.StateNotFoundError, LookupError),
        (ss.StateTypeError, TypeError),
        (ss.StateSchemaError, None),
        (ss.UserFunctionError, None),
        (ss.ConfigError, ValueError),
    ],
)
def test_every_error_derives_from_spark_state_error(cls, builtin):
    assert issubclass(cls, ss.SparkStateError)
    assert issubclass(ss.SparkStateError, Exception)
    if builtin is not None:
        assert issubclass(cls, builtin)


# --- reading -------------------------------------------------------------------------------------------

def test_a_new_key_has_no_state():
    s = GroupState(NT)
    assert s.exists is False
    assert s.getOption is None
    assert s.hasTimedOut is False
    assert s.timeout_ms is None


def test_get_without_state_raises_state_not_found_which_is_a_lookup_error():
    s = GroupState(NT)
    with pytest.raises(ss.StateNotFoundError, match=r"^state\.get: this key has no state\. Check state\.exists first,"
                                                    r" or use state\.getOption \(None when there is no state\)\.$"):
        s.get
    with pytest.raises(LookupError, match="this key has no state"):
        s.get


def test_existing_state_is_returned_by_get_and_get_option_even_when_falsy():
    s = GroupState(NT, value=0, exists=True)
    assert s.exists is True
    assert s.get == 0
    assert s.getOption == 0


def test_get_option_is_none_when_the_value_is_there_but_marked_absent():
    s = GroupState(NT, value=5, exists=False)
    assert s.getOption is None
    with pytest.raises(ss.StateNotFoundError):
        s.get


def test_properties_are_properties_and_the_rest_are_methods():
    # The same split as pyspark.sql.streaming.state.GroupState.
    for name in ("exists", "get", "getOption", "hasTimedOut"):
        assert isinstance(getattr(GroupState, name), property), name
    for name in ("update", "remove", "setTimeoutDuration", "setTimeoutTimestamp", "getCurrentWatermarkMs",
                 "getCurrentProcessingTimeMs"):
        assert callable(getattr(GroupState, name)) and not isinstance(getattr(GroupState, name), property), name


def test_has_timed_out_is_true_only_when_told():
    assert GroupState(PT, has_timed_out=True).hasTimedOut is True
    assert GroupState(PT).hasTimedOut is False


# --- update / remove --------------------------------------------------------------------------------------

def test_update_sets_the_state():
    s = GroupState(NT)
    s.update({"n": 1})
    assert s.exists and s.get == {"n": 1}


def test_update_none_raises_value_error_and_keeps_the_state():
    s = GroupState(NT, value=3, exists=True)
    with pytest.raises(ValueError, match=r"^state\.update\(None\): None cannot be stored as state; call state\.remove\(\)"
                                         r" instead\.$"):
        s.update(None)
    assert s.get == 3


def test_update_accepts_falsy_values_other_than_none():
    s = GroupState(NT)
    for v in (0, "", [], False):
        s.update(v)
        assert s.exists and s.get == v


def test_remove_removes_the_state_and_its_timeout():
    s = GroupState(PT, value=1, exists=True, batch_time_ms=1_000)
    s.setTimeoutDuration(5_000)
    s.remove()
    assert s.exists is False
    assert s.getOption is None
    assert s.timeout_ms is None
    with pytest.raises(ss.StateNotFoundError):
        s.get


def test_update_after_remove_brings_the_state_back():
    s = GroupState(NT, value=1, exists=True)
    s.remove()
    s.update(2)
    assert s.get == 2


# --- setTimeoutDuration --------------------------------------------------------------------------------

@pytest.mark.parametrize("duration", [60_000, timedelta(minutes=1), "1 minute", "60 seconds", "interval 1 minute"])
def test_set_timeout_duration_accepts_ms_timedelta_and_interval_strings(duration):
    s = GroupState(PT, batch_time_ms=5_000)
    s.setTimeoutDuration(duration)
    assert s.timeout_ms == 65_000


def test_set_timeout_duration_counts_from_the_batch_processing_time_and_the_last_call_wins():
    s = GroupState(PT, batch_time_ms=1_000)
    s.setTimeoutDuration("1 minute")
    s.setTimeoutDuration("2 seconds")
    assert s.timeout_ms == 3_000


def test_set_timeout_duration_without_processing_time_timeout_raises():
    s = GroupState(NT)
    with pytest.raises(ss.TimeoutConfigError,
                       match=r"^state\.setTimeoutDuration needs timeout=GroupStateTimeout\.ProcessingTimeTimeout, but this"
                             r" query uses NoTimeout\. Pass timeout=ss\.GroupStateTimeout\.ProcessingTimeTimeout to the"
                             r" operator\.$"):
        s.setTimeoutDuration("1 minute")


def test_set_timeout_duration_with_event_time_timeout_raises_and_points_to_set_timeout_timestamp():
    s = event_state()
    with pytest.raises(ss.TimeoutConfigError,
                       match=r"^state\.setTimeoutDuration needs timeout=GroupStateTimeout\.ProcessingTimeTimeout, but this"
                             r" query uses EventTimeTimeout\. .*, or use state\.setTimeoutTimestamp for event time\.$"):
        s.setTimeoutDuration(1_000)


def test_set_timeout_duration_checks_the_configuration_before_the_value():
    with pytest.raises(ss.TimeoutConfigError):
        GroupState(NT).setTimeoutDuration(0)


@pytest.mark.parametrize(
    ("duration", "shown"),
    [
        (0, r"0 \(0 ms\)"),
        (-1, r"-1 \(-1 ms\)"),
        (-60_000, r"-60000 \(-60000 ms\)"),
        ("0 seconds", r"'0 seconds' \(0 ms\)"),
        (timedelta(0), r"datetime\.timedelta\(0\) \(0 ms\)"),
        (timedelta(seconds=-1), r"datetime\.timedelta\(.*\) \(-1000 ms\)"),
    ],
)
def test_set_timeout_duration_zero_or_negative_raises_value_error(duration, shown):
    s = GroupState(PT, batch_time_ms=1_000)
    with pytest.raises(ValueError, match=rf"^state\.setTimeoutDuration: expected a positive duration, got {shown}$"):
        s.setTimeoutDuration(duration)
    assert s.timeout_ms is None


@pytest.mark.parametrize("duration", ["soon", None, 1.5, True])
def test_set_timeout_duration_rejects_values_that_are_not_durations(duration):
    with pytest.raises(ValueError, match=r"^state\.setTimeoutDuration: expected"):
        GroupState(PT).setTimeoutDuration(duration)


# --- setTimeoutTimestamp -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("conf", "hint"),
    [(NT, r"\.$"), (PT, r", or use state\.setTimeoutDuration for processing time\.$")],
)
def test_set_timeout_timestamp_without_event_time_timeout_raises(conf, hint):
    s = GroupState(conf)
    with pytest.raises(ss.TimeoutConfigError,
                       match=rf"^state\.setTimeoutTimestamp needs timeout=GroupStateTimeout\.EventTimeTimeout, but this"
                             rf" query uses {conf.value}\. Pass timeout=ss\.GroupStateTimeout\.EventTimeTimeout \(and"
                             rf" define a watermark with withWatermark\){hint}"):
        s.setTimeoutTimestamp(20_000)


def test_set_timeout_timestamp_accepts_epoch_ms():
    s = event_state()
    s.setTimeoutTimestamp(20_000)
    assert s.timeout_ms == 20_000


def test_set_timeout_timestamp_accepts_a_datetime():
    s = event_state(watermark_ms=0)
    s.setTimeoutTimestamp(datetime(2024, 1, 1, tzinfo=timezone.utc))
    assert s.timeout_ms == 1_704_067_200_000


@pytest.mark.parametrize("additional", [30_000, timedelta(seconds=30), "30 seconds"])
def test_set_timeout_timestamp_adds_additional(additional):
    s = event_state()
    s.setTimeoutTimestamp(20_000, additional)
    assert s.timeout_ms == 50_000


def test_set_timeout_timestamp_with_datetime_and_additional():
    s = event_state(watermark_ms=0)
    s.setTimeoutTimestamp(datetime(2024, 1, 1, tzinfo=timezone.utc), additional="1 minute")
    assert s.timeout_ms == 1_704_067_260_000


def test_set_timeout_timestamp_equal_to_the_watermark_is_allowed():
    s = event_state(watermark_ms=10_000)
    s.setTimeoutTimestamp(10_000)
    assert s.timeout_ms == 10_000


def test_set_timeout_timestamp_earlier_than_the_watermark_names_both_values():
    s = event_state(watermark_ms=10_000)
    with pytest.raises(ValueError, match=r"^Timeout timestamp \(5000, 1970-01-01 00:00:05\.000000 UTC\) cannot be earlier"
                                         r" than the current watermark \(10000, 1970-01-01 00:00:10\.000000 UTC\)\. Base the"
                                         r" timeout on the watermark, e\.g\. state\.setTimeoutTimestamp\("
                                         r"state\.getCurrentWatermarkMs\(\) \+ gap_ms\)\.$"):
        s.setTimeoutTimestamp(5_000)
    assert s.timeout_ms is None


def test_set_timeout_timestamp_checks_the_watermark_after_adding_additional():
    s = event_state(watermark_ms=10_000)
    s.setTimeoutTimestamp(5_000, additional=5_000)
    assert s.timeout_ms == 10_000
    with pytest.raises(ValueError, match=r"Timeout timestamp \(9999, .*\) cannot be earlier than the current watermark"
                                         r" \(10000, "):
        s.setTimeoutTimestamp(5_000, additional=4_999)


def test_set_timeout_timestamp_earlier_than_a_datetime_watermark_names_both_as_dates():
    wm = 1_704_067_200_000  # 2024-01-01 00:00:00 UTC
    s = event_state(watermark_ms=wm)
    with pytest.raises(ValueError, match=r"^Timeout timestamp \(1704067140000, 2023-12-31 23:59:00\.000000 UTC\) cannot"
                                         r" be earlier than the current watermark \(1704067200000, 2024-01-01"
                                         r" 00:00:00\.000000 UTC\)\."):
        s.setTimeoutTimestamp(datetime(2023, 12, 31, 23, 59, tzinfo=timezone.utc))


def test_set_timeout_timestamp_without_a_watermark_value_does_not_check_it():
    s = GroupState(ET, watermark_ms=NO_WATERMARK, has_watermark=False)
    s.setTimeoutTimestamp(1)
    assert s.timeout_ms == 1


@pytest.mark.parametrize("additional", [-1, "-1 seconds", timedelta(seconds=-1)])
def test_set_timeout_timestamp_rejects_a_negative_additional(additional):
    with pytest.raises(ValueError, match=r"^state\.setTimeoutTimestamp\(additional=…\): expected"):
        event_state().setTimeoutTimestamp(20_000, additional)


@pytest.mark.parametrize("ts", ["2024-01-01", 1.5, None, True])
def test_set_timeout_timestamp_rejects_values_that_are_not_instants(ts):
    with pytest.raises(ValueError, match=r"^state\.setTimeoutTimestamp: expected epoch milliseconds"):
        event_state().setTimeoutTimestamp(ts)


# --- time -------------------------------------------------------------------------------------------------

def test_get_current_watermark_ms_without_a_watermark_raises():
    for conf in (NT, PT, ET):
        s = GroupState(conf)
        with pytest.raises(ss.TimeoutConfigError,
                           match=r"^state\.getCurrentWatermarkMs: the query defines no watermark\. Call"
                                 r" df\.withWatermark\(\"event_time\", \"10 seconds\"\) before the operator\.$"):
            s.getCurrentWatermarkMs()


def test_get_current_watermark_ms_with_a_watermark():
    assert event_state(watermark_ms=42_000).getCurrentWatermarkMs() == 42_000
    assert GroupState(PT, watermark_ms=0, has_watermark=True).getCurrentWatermarkMs() == 0


def test_get_current_processing_time_ms_is_the_batch_time():
    assert GroupState(NT, batch_time_ms=123_456).getCurrentProcessingTimeMs() == 123_456


def test_the_timeout_starts_unset_on_every_call():
    # As in Spark: a call that does not set the timeout again clears it.
    s = GroupState(PT, value=1, exists=True, batch_time_ms=1_000)
    assert s.timeout_ms is None


def test_repr_shows_the_state_and_timeout():
    s = GroupState(PT, value=3, exists=True, batch_time_ms=0)
    s.setTimeoutDuration(10)
    assert repr(s) == "GroupState(3, timeout_ms=10, hasTimedOut=False)"
    assert repr(GroupState(NT, has_timed_out=True)) == "GroupState(<none>, timeout_ms=None, hasTimedOut=True)"


# --- GroupStateTimeout ------------------------------------------------------------------------------------

def test_group_state_timeout_equals_the_strings_pyspark_uses():
    assert PT == "ProcessingTimeTimeout"
    assert ET == "EventTimeTimeout"
    assert NT == "NoTimeout"
    assert str(PT) == "ProcessingTimeTimeout"


@pytest.mark.parametrize(
    ("given", "parsed"),
    [(None, NT), (PT, PT), ("EventTimeTimeout", ET), ("processingtimetimeout", PT), ("NOTIMEOUT", NT)],
)
def test_group_state_timeout_parse(given, parsed):
    assert ss.GroupStateTimeout.parse(given) is parsed


@pytest.mark.parametrize(("given", "shown"), [("ProcessingTime", "'ProcessingTime'"), (1, "1"), (True, "True")])
def test_group_state_timeout_parse_rejects_other_values(given, shown):
    with pytest.raises(ss.TimeoutConfigError, match=rf"^timeout: expected one of NoTimeout, ProcessingTimeTimeout,"
                                                    rf" EventTimeTimeout \(ss\.GroupStateTimeout\.…\), got {shown}$"):
        ss.GroupStateTimeout.parse(given)


# --- is_due ---------------------------------------------------------------------------------------------

def test_is_due_is_strictly_before():
    assert is_due(1_000, 1_001)
    assert not is_due(1_000, 1_000)
    assert not is_due(1_000, 999)


def test_timer_for_a_timeout_fires_when_it_is_due():
    assert timer_for(1_000) == 1_001
    assert not is_due(1_000, timer_for(1_000) - 1) and is_due(1_000, timer_for(1_000))
    assert timer_for(1_000, now_ms=999) == 1_001
    assert timer_for(1_000, now_ms=1_000) == 1_001
    assert timer_for(1_000, now_ms=5_000) == 5_001  # already due: the next batch's timer


def test_initial_timeout_is_the_column_or_the_idle_timeout_and_none_without_timeouts():
    assert initial_timeout(NT, 5_000, 100, 1_000) is None
    assert initial_timeout(PT, 5_000, 100, 1_000) == 5_000
    assert initial_timeout(PT, None, 100, 1_000) == 1_100
    assert initial_timeout(PT, None, None, 1_000) is None
    assert initial_timeout(ss.GroupStateTimeout.EventTimeTimeout, 7, None, 1_000) == 7


# --- run_call: outputs -------------------------------------------------------------------------------------

def call(func, state=None, *, key="k", values=(), flat=False, old_timeout_ms=None, keep_expired_state=False):
    return run_call(func, key, iter(values), state if state is not None else GroupState(PT, batch_time_ms=1_000),
                    flat=flat, old_timeout_ms=old_timeout_ms, keep_expired_state=keep_expired_state)


def test_run_call_passes_key_values_and_state():
    seen = []
    s = GroupState(PT)

    def f(key, values, state):
        seen.append((key, list(values), state))

    call(f, s, key=("a", 1), values=[1, 2])
    assert seen == [(("a", 1), [1, 2], s)]


@pytest.mark.parametrize(("result", "outputs"), [(None, []), (("k", 1), [("k", 1)]), ([], [[]]), (0, [0])])
def test_run_call_map_returns_one_output_or_none(result, outputs):
    assert call(lambda k, v, s: result).outputs == outputs


@pytest.mark.parametrize(("result", "outputs"), [(None, []), ([], []), ([1, 2], [1, 2]), ((x for x in "ab"), ["a", "b"])])
def test_run_call_flat_returns_every_output_of_an_iterable(result, outputs):
    assert call(lambda k, v, s: result, flat=True).outputs == outputs


# --- run_call: what is written ----------------------------------------------------------------------

def test_run_call_that_changes_nothing_writes_nothing():
    out = call(lambda k, v, s: None, GroupState(NT, value=1, exists=True))
    assert out == Outcome([], False, True, 1, None)


def test_run_call_update_writes():
    def f(k, v, s):
        s.update(s.getOption + 1)

    out = call(f, GroupState(NT, value=1, exists=True))
    assert (out.write, out.exists, out.value) == (True, True, 2)


def test_run_call_remove_writes_and_reports_no_state():
    def f(k, v, s):
        s.remove()

    out = call(f, GroupState(NT, value=1, exists=True))
    assert (out.write, out.exists, out.value, out.timeout_ms) == (True, False, None, None)
    assert out.delete


def test_run_call_deletes_the_row_only_when_neither_state_nor_timeout_is_left():
    def f(k, v, s):
        s.remove()
        s.setTimeoutDuration(500)

    assert not call(f, GroupState(PT, value=1, exists=True, batch_time_ms=1_000)).delete
    assert not call(lambda k, v, s: s.update(2), GroupState(NT, value=1, exists=True)).delete
    assert not call(lambda k, v, s: None, GroupState(NT)).delete  # nothing written


def test_run_call_writes_when_the_timeout_changes_and_not_when_it_is_set_to_the_same_value():
    def f(k, v, s):
        s.setTimeoutDuration(500)

    assert call(f, GroupState(PT, value=1, exists=True, batch_time_ms=1_000), old_timeout_ms=1_500).write is False
    changed = call(f, GroupState(PT, value=1, exists=True, batch_time_ms=2_000), old_timeout_ms=1_500)
    assert (changed.write, changed.timeout_ms) == (True, 2_500)


def test_run_call_that_does_not_set_the_timeout_clears_it():
    out = call(lambda k, v, s: None, GroupState(PT, value=1, exists=True), old_timeout_ms=5_000)
    assert (out.write, out.exists, out.timeout_ms) == (True, True, None)


# --- run_call: expired state (api.md 1.3) ----------------------------------------------------------

def timed_out(value=1):
    return GroupState(PT, value=value, exists=True, has_timed_out=True, batch_time_ms=10_000)


def test_a_timeout_call_that_neither_updates_nor_sets_a_timeout_removes_the_state():
    out = call(lambda k, v, s: ("bye", s.get), timed_out(), old_timeout_ms=5_000)
    assert out == Outcome([("bye", 1)], True, False, None, None)


def test_keep_expired_state_keeps_it_as_spark_does():
    out = call(lambda k, v, s: None, timed_out(), old_timeout_ms=5_000, keep_expired_state=True)
    assert (out.write, out.exists, out.value, out.timeout_ms) == (True, True, 1, None)


def test_a_timeout_call_that_updates_keeps_the_state():
    def f(k, v, s):
        s.update(s.get + 1)

    out = call(f, timed_out(), old_timeout_ms=5_000)
    assert (out.exists, out.value, out.timeout_ms) == (True, 2, None)


def test_a_timeout_call_that_sets_a_new_timeout_keeps_the_state():
    def f(k, v, s):
        s.setTimeoutDuration("1 minute")

    out = call(f, timed_out(), old_timeout_ms=5_000)
    assert (out.exists, out.value, out.timeout_ms) == (True, 1, 70_000)


def test_a_call_with_data_is_never_expired():
    out = call(lambda k, v, s: None, GroupState(PT, value=1, exists=True), values=[1])
    assert out.exists is True


# --- run_call: errors -----------------------------------------------------------------------------------

def test_run_call_misuse_errors_keep_their_type_and_name_the_key():
    with pytest.raises(ss.StateNotFoundError, match=r"this key has no state\. .* \(key 'u1'\)$") as info:
        call(lambda k, v, s: s.get, GroupState(PT), key="u1")
    assert isinstance(info.value, LookupError)

    def wrong_timeout(k, v, s):
        s.setTimeoutTimestamp(1)

    with pytest.raises(ss.TimeoutConfigError, match=r"needs timeout=GroupStateTimeout\.EventTimeTimeout.* \(key 'u1'\)$"):
        call(wrong_timeout, GroupState(PT), key="u1")


@pytest.mark.parametrize(
    ("misuse", "message"),
    [
        (lambda s: s.update(None), r"^state\.update\(None\): None cannot be stored as state; call state\.remove\(\)"
                                   r" instead\. \(key \('a', 2\)\)$"),
        (lambda s: s.setTimeoutDuration(0), r"^state\.setTimeoutDuration: expected a positive duration, got 0 \(0 ms\)"
                                            r" \(key \('a', 2\)\)$"),
    ],
)
def test_run_call_value_errors_of_the_state_api_stay_value_errors_and_name_the_key(misuse, message):
    with pytest.raises(ValueError, match=message) as info:
        call(lambda k, v, s: misuse(s), GroupState(PT), key=("a", 2))
    assert type(info.value) is ValueError


def test_run_call_watermark_error_names_both_values_and_the_key():
    def f(k, v, s):
        s.setTimeoutTimestamp(s.getCurrentWatermarkMs() - 1)

    with pytest.raises(ValueError, match=r"^Timeout timestamp \(9999, .*\) cannot be earlier than the current watermark"
                                         r" \(10000, .* \(key 'k'\)$"):
        call(f, event_state())


def named_failure(key, values, state):
    return 1 / 0


@pytest.mark.parametrize(
    ("func", "raised"),
    [
        (named_failure, r"ZeroDivisionError: division by zero"),
        (lambda k, v, s: {}["missing"], r"KeyError: 'missing'"),
        (lambda k, v, s: int("x"), r"ValueError: invalid literal for int\(\) with base 10: 'x'"),
        (lambda k, v, s: json.loads("{"), r"JSONDecodeError: Expecting property name"),
        (lambda k, v, s: s.get.no_such_attribute, r"AttributeError: 'int' object has no attribute 'no_such_attribute'"),
    ],
)
def test_a_user_exception_becomes_user_function_error_naming_the_key(func, raised):
    with pytest.raises(ss.UserFunctionError, match=rf"^the state function '.*' raised {raised}.* \(key 'u7'\)\. Fix the"
                                                   r" function and restart the query on the same checkpoint: the failed"
                                                   r" batch is processed again\.$") as info:
        call(func, GroupState(PT, value=1, exists=True), key="u7")
    assert info.value.__cause__ is not None
    assert not isinstance(info.value, (ValueError, LookupError))


def test_user_function_error_names_the_function():
    with pytest.raises(ss.UserFunctionError, match=r"^the state function 'named_failure' raised ZeroDivisionError"):
        call(named_failure)


def test_an_error_raised_while_iterating_flat_outputs_becomes_user_function_error():
    def gen(k, v, s):
        yield 1
        raise RuntimeError("late")

    with pytest.raises(ss.UserFunctionError, match=r"raised RuntimeError: late \(key 'k'\)"):
        call(gen, flat=True)


def test_keyboard_interrupt_is_not_wrapped():
    def stop(k, v, s):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        call(stop)


# --- State (map_with_state) -------------------------------------------------------------------------

def test_state_mirrors_the_dstream_methods():
    g = GroupState(NT)
    s = State(g)
    assert s.exists() is False
    assert s.getOption() is None
    assert s.isTimingOut() is False
    s.update(5)
    assert (s.exists(), s.get(), s.getOption()) == (True, 5, 5)
    assert g.get == 5
    s.remove()
    assert s.exists() is False
    assert repr(State(GroupState(NT, value=2, exists=True), timing_out=True)) == "State(2, timingOut=True)"


def test_state_get_without_state_raises_state_not_found():
    with pytest.raises(ss.StateNotFoundError, match=r"^state\.get: this key has no state"):
        State(GroupState(NT)).get()


def test_state_update_none_raises_value_error():
    with pytest.raises(ValueError, match=r"^state\.update\(None\)"):
        State(GroupState(NT)).update(None)


def test_state_update_while_timing_out_raises():
    s = State(GroupState(PT, value=1, exists=True, has_timed_out=True), timing_out=True)
    assert s.isTimingOut() is True
    with pytest.raises(ss.TimeoutConfigError, match=r"^state\.update: this key is timing out and its state is removed"
                                                    r" after this call; it cannot be updated\. Return the final output"
                                                    r" instead\.$"):
        s.update(2)
    assert s.get() == 1


# --- StateSpec (map_with_state) ---------------------------------------------------------------------------

def track(key, value, state):
    return None


def test_state_spec_function_starts_an_empty_spec():
    spec = ss.StateSpec.function(track)
    assert (spec.func, spec.initial, spec.partitions, spec.timeout_ms) == (track, None, None, None)


@pytest.mark.parametrize("func", [None, 3, "track"])
def test_state_spec_function_rejects_non_callables(func):
    with pytest.raises(ss.ConfigError, match=rf"^StateSpec\.function: expected a function \(key, value, state\) ->"
                                             rf" output, got {func!r}$"):
        ss.StateSpec.function(func)


def test_state_spec_builders_return_new_specs_and_never_change_the_original():
    base = ss.StateSpec.function(track)
    initial = object()
    built = base.initial_state(initial).num_partitions(4).timeout("60 seconds")
    assert (built.func, built.initial, built.partitions, built.timeout_ms) == (track, initial, 4, 60_000)
    assert (base.initial, base.partitions, base.timeout_ms) == (None, None, None)
    assert built is not base


def test_state_spec_is_frozen():
    import dataclasses

    spec = ss.StateSpec.function(track)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.partitions = 3  # type: ignore[misc]


def test_state_spec_camel_case_aliases():
    initial = object()
    spec = ss.StateSpec.function(track).initialState(initial).numPartitions(2)
    assert (spec.initial, spec.partitions) == (initial, 2)


@pytest.mark.parametrize("n", [0, -1, 2.0, "2", True, None])
def test_state_spec_num_partitions_must_be_a_positive_int(n):
    spec = ss.StateSpec.function(track)
    with pytest.raises(ss.ConfigError, match=rf"^StateSpec\.num_partitions: expected a positive int, got {n!r}$"):
        spec.num_partitions(n)
    with pytest.raises(ValueError):  # ConfigError is a ValueError too
        spec.numPartitions(n)


@pytest.mark.parametrize("duration", [60_000, timedelta(minutes=1), "1 minute", "60 seconds"])
def test_state_spec_timeout_accepts_every_duration_form(duration):
    assert ss.StateSpec.function(track).timeout(duration).timeout_ms == 60_000


@pytest.mark.parametrize(("duration", "shown"), [(0, r"0 \(0 ms\)"), ("-1 seconds", None), (timedelta(seconds=-1), None)])
def test_state_spec_timeout_rejects_zero_and_negative(duration, shown):
    with pytest.raises(ValueError, match=r"^StateSpec\.timeout: expected") as info:
        ss.StateSpec.function(track).timeout(duration)
    if shown is not None:
        assert str(info.value) == "StateSpec.timeout: expected a positive duration, got 0 (0 ms)"


def test_state_spec_timeout_rejects_unparseable_strings():
    with pytest.raises(ValueError, match=r"^StateSpec\.timeout: expected a duration such as '1 minute'.* got 'a while'$"):
        ss.StateSpec.function(track).timeout("a while")
