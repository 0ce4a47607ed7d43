"""The update-mode pipelines' ``reason=`` on real Spark streams (sparkstate.pipelines.refusals): a
row with a reason comes out refused, with its reason and carried columns, and changes nothing
else. A key whose rows in a batch are all refused gets no row of its own for that batch and its
state goes on untouched; a key with only refused rows never gets state. The good rows' output is
exactly what the pipeline gives without the refused rows."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from sparkstate.errors import ConfigError
from sparkstate.pipelines import first_last_activity, running_count, visited_pages

from ..streams import LandingDir, StreamRun
from . import test_first_last_activity as fla
from .test_sessionize_order import ENGINES

WHY = "why string, raw string"


def _run(spark, tmp_path, build, schema: str, batches: list[list[dict]]) -> list[tuple[list, Counter]]:
    """Each batch's output: the pipeline's own rows (``rejected`` null), and the refused rows as
    (key, reason, raw)."""
    land = LandingDir(tmp_path / "in")
    land.add(batches[0])
    out = build(land.stream(spark, f"{schema}, {WHY}"))
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        for batch in batches[1:]:
            run.wait_input()
            land.add(batch)
        run.wait_input()
        got = run.batches
    assert len(got) == len(batches)
    return [([r for r in rows if r.rejected is None],
             Counter((r[0], r.rejected.reason, r.rejected.raw) for r in rows if r.rejected is not None))
            for rows in got]


def _mixed(batches: list[list[dict]], refused: list[list[tuple]], key: str, seed: int) -> list[list[dict]]:
    """``batches`` with the refused rows (key, n) among their rows, shuffled."""
    rng = random.Random(seed)
    mixed = []
    for good, bad in zip(batches, refused):
        rows = [dict(r) for r in good] + [{key: k, "why": f"broken record {n}", "raw": f"<{n}>"} for k, n in bad]
        rng.shuffle(rows)
        mixed.append(rows)
    return mixed


def _expected_refused(refused: list[list[tuple]]) -> list[Counter]:
    return [Counter((k, f"broken record {n}", f"<{n}>") for k, n in bad) for bad in refused]


# "spark" has state before batch 2, where all its rows are refused; "ghost" and the null key only ever are
REFUSED = [[("ghost", 1)], [("spark", 2), ("spark", 3), (None, 4)], [("ghost", 5)]]


@pytest.mark.parametrize("engine", ENGINES)
def test_running_count_counts_only_rows_without_a_reason(spark, tmp_path, engine):
    words = [["spark", "state", "spark"], ["state"], ["spark", "new", "state"]]
    batches = _mixed([[{"word": w} for w in ws] for ws in words], REFUSED, "word", seed=7)
    got = _run(spark, tmp_path, lambda df: running_count(df, engine=engine, reason="why", carry=["raw"]),
               "word string", batches)
    assert [sorted((r.word, r["count"]) for r in rows) for rows, _ in got] == [
        [("spark", 2), ("state", 1)],
        [("state", 2)],  # spark: only refused rows, no count row, its count untouched
        [("new", 1), ("spark", 3), ("state", 3)],
    ]
    assert [refused for _, refused in got] == _expected_refused(REFUSED)


def test_first_last_activity_spans_ignore_rows_with_a_reason(spark, tmp_path):
    refused = [[("ann", 1)], [("ann", 2), ("zed", 3)], [], [("bob", 4), ("ann", 5)]]
    batches = _mixed(fla.BATCHES, refused, "user", seed=11)
    for batch in batches:  # refused rows with times that would change the spans, were they applied
        for r in batch:
            if r.get("why"):
                r.update(timestamp=fla.t("13:00").isoformat(), activity="refused")
    got = _run(spark, tmp_path, lambda df: first_last_activity(df, reason="why", carry=["raw"]),
               fla.SCHEMA, batches)
    assert [fla.spans(rows) for rows, _ in got] == fla.EXPECTED
    assert [r for _, r in got] == _expected_refused(refused)


def test_visited_pages_lists_only_visits_without_a_reason(spark, tmp_path):
    visits = [[("a", "page4")], [("b", "page5"), ("b", "page6")], [("a", "page7"), ("d", "page1")]]
    refused = [[("b", 1)], [("a", 2), ("a", 3)], [("e", 4)]]
    batches = [[{"user_id": u, "page": p} for u, p in batch] for batch in visits]
    # refused visits first in each file: a per-record function would see them before the good ones
    batches = [[{"user_id": k, "page": "refused", "why": f"broken record {n}", "raw": f"<{n}>"} for k, n in bad] + good
               for good, bad in zip(batches, refused)]
    got = _run(spark, tmp_path, lambda df: visited_pages(df, reason="why", carry=["raw"]),
               "user_id string, page string", batches)
    assert [sorted((r.user_id, tuple(r.visited_pages)) for r in rows) for rows, _ in got] == [
        [("a", ("page4",))],
        [("b", ("page5",)), ("b", ("page5", "page6"))],
        [("a", ("page4", "page7")), ("d", ("page1",))],
    ]
    assert [r for _, r in got] == _expected_refused(refused)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"carry": ["raw"]}, "running_count: carry= copies columns into refused rows, which only reason= makes"),
        ({"reason": "n"}, "running_count: reason column 'n' must be of type string, but it is int"),
        ({"reason": "word"}, "running_count: reason column 'word' is already a column running_count uses"),
        ({"reason": "why", "carry": ["why"]}, "running_count: reason column 'why' is already a column"),
        ({"reason": "why", "carry": ["nope"]}, "running_count: carry column 'nope' is not in the input"),
    ],
)
def test_reason_and_carry_are_checked_when_defined(spark, kwargs, message):
    df = spark.createDataFrame([], f"word string, {WHY}, n int, rejected string")
    with pytest.raises(ConfigError) as err:
        running_count(df, **kwargs)
    assert message in str(err.value)
    with pytest.raises(ConfigError, match="the key column cannot be called 'rejected'"):
        running_count(df, key="rejected", reason="why")
    assert running_count(df, key="rejected").columns == ["rejected", "count"]  # no reason=, no such column
