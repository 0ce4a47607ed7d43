"""Durations and instants at the public boundary (``sparkstate.durations``)."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pytest

from sparkstate.durations import instant_ms, ms_to_datetime, positive_ms, to_ms, utc


# --- to_ms: interval strings ------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1 minute", 60_000),
        ("30 seconds", 30_000),
        ("1 second", 1_000),
        ("250 milliseconds", 250),
        ("250 ms", 250),
        ("5 millis", 5),
        ("2 hours", 7_200_000),
        ("1 hour", 3_600_000),
        ("3 days", 259_200_000),
        ("1 day", 86_400_000),
        ("2 weeks", 1_209_600_000),
        ("10 mins", 600_000),
        ("45 secs", 45_000),
        ("10 s", 10_000),
        ("5 m", 300_000),
        ("1 h", 3_600_000),
        ("1 d", 86_400_000),
        ("1 w", 604_800_000),
    ],
)
def test_to_ms_parses_each_unit(text, ms):
    assert to_ms(text) == ms


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1 hour 30 minutes", 5_400_000),
        ("1 minute 30 seconds 500 ms", 90_500),
        ("1minute30seconds", 90_000),
        ("  2   minutes  ", 120_000),
        ("1.5 seconds", 1_500),
        ("0.25 minutes", 15_000),
        ("interval 1 minute", 60_000),
        ("INTERVAL 2 SECONDS", 2_000),
        ("1 MINUTE", 60_000),
        ("3 Seconds", 3_000),
        ("0 seconds", 0),
    ],
)
def test_to_ms_parses_combinations_case_decimals_and_interval_prefix(text, ms):
    assert to_ms(text) == ms


def test_to_ms_rounds_fractional_milliseconds_to_nearest():
    assert to_ms("1.0004 seconds") == 1_000
    assert to_ms("1.0006 seconds") == 1_001


@pytest.mark.parametrize(
    "text",
    ["1", "minute", "1 fortnight", "1 month", "1 year", "1 minute,", "one minute", "-5 seconds", "1e3 ms",
     "1 minute and 2 seconds", "1.2.3 seconds"],
)
def test_to_ms_rejects_malformed_strings_and_quotes_them(text):
    with pytest.raises(ValueError, match=r"expected a duration such as '1 minute'") as info:
        to_ms(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("text", ["", "   "])
def test_to_ms_rejects_empty_strings(text):
    with pytest.raises(ValueError, match=r"^duration: expected a duration such as '1 minute', got an empty string$"):
        to_ms(text)


def test_to_ms_message_names_what_was_being_parsed():
    with pytest.raises(ValueError, match=r"^gap: expected a duration .* got '10 parsecs'$"):
        to_ms("10 parsecs", "gap")


def test_to_ms_errors_are_plain_value_errors_not_library_errors():
    import sparkstate as ss

    with pytest.raises(ValueError) as info:
        to_ms("soon")
    assert type(info.value) is ValueError
    assert not isinstance(info.value, ss.SparkStateError)


# --- to_ms: numbers and timedelta ---------------------------------------------------------------

@pytest.mark.parametrize("ms", [0, 1, 1_500, -3_000, 10**15])
def test_to_ms_passes_ints_through_as_milliseconds(ms):
    assert to_ms(ms) == ms


def test_to_ms_accepts_integral_floats_only():
    assert to_ms(2.0) == 2
    assert isinstance(to_ms(2.0), int)
    with pytest.raises(ValueError, match=r"^duration: expected milliseconds \(int\), a timedelta or a string like"
                                         r" '1 minute', got float 1\.5$"):
        to_ms(1.5)


@pytest.mark.parametrize(
    ("td", "ms"),
    [
        (timedelta(seconds=2), 2_000),
        (timedelta(minutes=1, seconds=30), 90_000),
        (timedelta(milliseconds=1), 1),
        (timedelta(days=2), 172_800_000),
        (timedelta(0), 0),
        (timedelta(seconds=-5), -5_000),
        (timedelta(microseconds=400), 0),
        (timedelta(microseconds=600), 1),
    ],
)
def test_to_ms_converts_timedelta(td, ms):
    assert to_ms(td) == ms
    assert isinstance(to_ms(td), int)


@pytest.mark.parametrize("flag", [True, False])
def test_to_ms_rejects_bool_although_it_is_an_int(flag):
    with pytest.raises(ValueError, match=r"^timeout: expected milliseconds, a timedelta or a string like"
                                         r" '1 minute', got a bool$"):
        to_ms(flag, "timeout")


@pytest.mark.parametrize(
    ("value", "shown"),
    [(None, "NoneType None"), ([1], r"list \[1\]"), (object, "type <class 'object'>"), (b"1 minute", "bytes b'1 minute'")],
)
def test_to_ms_rejects_other_types_naming_the_type_and_value(value, shown):
    with pytest.raises(ValueError, match=rf"^duration: expected milliseconds \(int\), a timedelta or a string .* got {shown}$"):
        to_ms(value)


# --- positive_ms ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["2 seconds", 2_000, timedelta(seconds=2), 2_000.0])
def test_positive_ms_accepts_positive_durations_of_every_form(value):
    assert positive_ms(value) == 2_000


def test_positive_ms_accepts_one_millisecond():
    assert positive_ms(1) == 1


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0, r"0 \(0 ms\)"),
        (-1, r"-1 \(-1 ms\)"),
        ("0 seconds", r"'0 seconds' \(0 ms\)"),
        (timedelta(0), r"datetime\.timedelta\(0\) \(0 ms\)"),
        (timedelta(seconds=-3), r"datetime\.timedelta\(.*\) \(-3000 ms\)"),
        (timedelta(microseconds=100), r"datetime\.timedelta\(microseconds=100\) \(0 ms\)"),
    ],
)
def test_positive_ms_rejects_zero_and_negative_with_value_and_ms(value, shown):
    with pytest.raises(ValueError, match=rf"^state timeout: expected a positive duration, got {shown}$"):
        positive_ms(value, "state timeout")


def test_positive_ms_still_reports_unparseable_input():
    with pytest.raises(ValueError, match="expected a duration such as"):
        positive_ms("later")


# --- instant_ms -----------------------------------------------------------------------------------

def test_instant_ms_passes_epoch_ms_through():
    assert instant_ms(0) == 0
    assert instant_ms(1_704_067_200_000) == 1_704_067_200_000


def test_instant_ms_converts_aware_datetimes_exactly():
    assert instant_ms(datetime(2024, 1, 1, tzinfo=timezone.utc)) == 1_704_067_200_000
    assert instant_ms(datetime(1970, 1, 1, 0, 0, 1, 123_000, tzinfo=timezone.utc)) == 1_123
    plus_two = timezone(timedelta(hours=2))
    assert instant_ms(datetime(2024, 1, 1, 2, 0, tzinfo=plus_two)) == 1_704_067_200_000


def test_instant_ms_keeps_milliseconds_of_a_recent_datetime():
    assert instant_ms(datetime(2024, 6, 1, 12, 0, 0, 999_000, tzinfo=timezone.utc)) % 1000 == 999


def test_instant_ms_reads_naive_datetimes_as_local_time():
    naive = datetime(2024, 3, 10, 8, 30, 15)
    as_local = naive.astimezone()  # the same wall-clock time in the machine's zone
    assert instant_ms(naive) == instant_ms(as_local)


def test_instant_ms_reads_a_date_as_local_midnight():
    assert instant_ms(date(2024, 3, 10)) == instant_ms(datetime(2024, 3, 10))


@pytest.mark.parametrize("flag", [True, False])
def test_instant_ms_rejects_bool(flag):
    with pytest.raises(ValueError, match=r"^watermark: expected epoch milliseconds or a datetime, got a bool$"):
        instant_ms(flag, "watermark")


@pytest.mark.parametrize(
    ("value", "shown"),
    [("2024-01-01", "str '2024-01-01'"), (1.5, "float 1.5"), (None, "NoneType None"),
     (timedelta(seconds=1), r"timedelta datetime\.timedelta\(seconds=1\)")],
)
def test_instant_ms_rejects_other_types(value, shown):
    with pytest.raises(ValueError, match=rf"^timestamp: expected epoch milliseconds \(int\) or a datetime, got {shown}$"):
        instant_ms(value)


# --- back to datetimes ------------------------------------------------------------------------------

def test_utc_gives_an_aware_utc_datetime():
    assert utc(0) == datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert utc(1_704_067_200_500) == datetime(2024, 1, 1, 0, 0, 0, 500_000, tzinfo=timezone.utc)
    assert utc(0).tzinfo is timezone.utc


@pytest.mark.parametrize("ms", [0, 1_704_067_200_000, 1_704_067_200_123])
def test_ms_to_datetime_is_naive_local_and_inverts_instant_ms(ms):
    dt = ms_to_datetime(ms)
    assert dt.tzinfo is None
    assert instant_ms(dt) == ms
