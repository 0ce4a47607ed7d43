"""The synthetic clickstream and its reference sessions (no Spark)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

import pytest

from sparkstate.errors import ConfigError
from sparkstate.synthetic import Event, generate_events, read_events, reference_sessions, write_events

GAP = timedelta(minutes=1)


def test_same_seed_same_events_other_seed_other_events():
    assert generate_events(300, users=7, seed=1) == generate_events(300, users=7, seed=1)
    assert generate_events(300, users=7, seed=1) != generate_events(300, users=7, seed=2)


def test_shape_of_the_stream():
    events = generate_events(500, users=9, seed=4)
    assert len(events) == 500 and len({e.user_id for e in events}) == 9
    assert [e.event_time for e in events] == sorted(e.event_time for e in events)
    sessions = reference_sessions(events, GAP)
    assert sum(s.event_count for s in sessions) == 500
    # Gaps inside a session are within the gap; a session not ended by is_last is followed by a longer pause.
    by_user: dict[str, list] = {}
    for s in sessions:
        by_user.setdefault(s.user_id, []).append(s)
    for user_sessions in by_user.values():
        for earlier, later in zip(user_sessions, user_sessions[1:]):
            assert earlier.session_end < later.session_start
            if earlier.closed_by == "timeout":
                assert later.session_start - earlier.session_end > GAP
    closed = {s.closed_by for s in sessions}
    assert closed == {"last_event", "timeout"}
    # Some sessions start within the gap after an is_last event: only the flag separates them.
    assert any(
        a.closed_by == "last_event" and b.session_start - a.session_end <= GAP
        for ss in by_user.values() for a, b in zip(ss, ss[1:])
    )


def test_reference_splits_on_gap_and_after_is_last():
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    events = [  # not in time order, two users
        Event("u", at(60), "b"), Event("u", at(0), "a"), Event("v", at(5), "x", is_last=True),
        Event("u", at(121), "c"), Event("u", at(130), "d", is_last=True), Event("u", at(131), "e"),
    ]
    got = [(s.user_id, s.events, s.closed_by, s.session_start, s.session_end) for s in reference_sessions(events, GAP)]
    assert got == [
        ("u", ("a", "b"), "timeout", at(0), at(60)),      # exactly the gap apart: same session
        ("u", ("c", "d"), "last_event", at(121), at(130)),  # 61 s after b: a new session
        ("u", ("e",), "timeout", at(131), at(131)),
        ("v", ("x",), "last_event", at(5), at(5)),
    ]
    # With a watermark, a final session is finished only once end + gap is before it.
    assert len(reference_sessions(events, GAP, watermark=at(191))) == 3
    assert len(reference_sessions(events, GAP, watermark=at(191) + timedelta(milliseconds=1))) == 4


def test_write_events_splits_in_order_with_increasing_mtimes(tmp_path):
    events = generate_events(103, users=5, seed=2)
    paths = write_events(events, tmp_path, files=4)
    assert [len(p.read_text().splitlines()) for p in paths] == [26, 26, 26, 25]
    assert read_events(paths) == events
    mtimes = [os.stat(p).st_mtime for p in paths]
    assert mtimes == sorted(mtimes) and len(set(mtimes)) == 4
    first = json.loads(paths[0].read_text().splitlines()[0])
    assert set(first) == {"user_id", "event_time", "data", "is_last"} and first["event_time"].endswith("Z")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_write_events_never_overwrites(tmp_path):
    write_events(generate_events(10, users=2), tmp_path, files=2)
    with pytest.raises(ConfigError, match="already holds part-00000.json, part-00001.json"):
        write_events(generate_events(10, users=2), tmp_path, files=2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"users": 0}, "users >= 1"),
        ({"last_share": 1.5}, "last_share is a share between 0 and 1"),
        ({"max_session_events": 0}, "max_session_events must be >= 1"),
        ({"gap": "0 seconds"}, "generate_events: gap: expected a positive duration"),
    ],
)
def test_bad_generator_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_events(10, **kwargs)
