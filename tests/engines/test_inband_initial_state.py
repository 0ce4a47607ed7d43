"""Initial state on the inband engine (applyInPandasWithState has none: the engine's seeds,
sparkstate.engines.inband.seeds): applied once, in the first batch, never on a restart; a
restart with or without it; duplicate keys refused; a static DataFrame. Runs on every minor
(the inband engine is on all of them; it is the default of PySpark 3.5)."""

from __future__ import annotations

import tempfile

import pytest

import sparkstate as ss
from sparkstate.engines.inband import seeds
from sparkstate.errors import ConfigError
from tests.streams import LandingDir, StreamRun


def counter(key, rows, state):
    vals = [r.v for r in rows]
    if "drop" in vals:
        state.remove()
        return (key, -1)
    n = (state.getOption or 0) + len(vals)
    state.update(n)
    return (key, n)


def _query(spark, land, initial=None, checkpoint=None):
    return ss.map_groups_with_state(land.stream(spark, "k string, v string"), key="k", func=counter, state_type=int,
                                    output_type="k string, n long", engine=ss.InBandEngine(buckets=2),
                                    initial_state=initial, checkpoint=checkpoint)


def _initial(spark, **counts):
    return spark.createDataFrame(sorted(counts.items()), "k string, value long")


def _run(spark, land, ck, batches, *, already, **kwargs):
    """One run on ``ck``: each of ``batches`` landed and read in turn; its rows, sorted per batch."""
    out = []
    with StreamRun(spark, _query(spark, land, **kwargs), ck, landing=land, already_read=already) as run:
        for batch in batches:
            want = len(run.rows) + len({k for k, _ in batch})
            land.add([{"k": k, "v": v} for k, v in batch])
            run.wait_input()
            run.wait_for(lambda rows, want=want: len(rows) >= want)
        out = sorted(tuple(r) for r in run.rows)
    return out


def test_initial_state_is_applied_once_and_a_restart_goes_on_with_or_without_it(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    ck = tmp_path / "ck"
    # checkpoint= given: the seeds are staged in the checkpoint, and a restart reads the same source
    first = _run(spark, land, ck, [[("a", "x"), ("c", "x")]], already=0,
                 initial=_initial(spark, a=10, b=20), checkpoint=ck)
    assert first == [("a", 11), ("c", 1)]
    # restarted without initial_state: goes on from the stored state (b kept its 20)
    second = _run(spark, land, ck, [[("a", "x"), ("b", "x")]], already=2, checkpoint=ck)
    assert second == [("a", 12), ("b", 21)]
    # restarted with another initial state: ignored, as Spark ignores it on a restart
    third = _run(spark, land, ck, [[("a", "x"), ("d", "x")]], already=4,
                 initial=_initial(spark, a=500, d=500), checkpoint=ck)
    assert third == [("a", 13), ("d", 1)]


def test_a_restart_given_the_initial_state_again_never_reseeds_a_bucket_that_emptied(spark, tmp_path, monkeypatch):
    land = LandingDir(tmp_path / "in")
    ck = tmp_path / "ck"
    temp = tmp_path / "machine-tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    initial = _initial(spark, a=10, b=20, c=30)
    # no checkpoint= to the operator: the seeds are staged elsewhere and staged again on the restart
    first = _run(spark, land, ck, [[("a", "x")], [("a", "drop"), ("b", "drop"), ("c", "drop")]], already=0,
                 initial=initial)
    assert first == [("a", -1), ("a", 11), ("b", -1), ("c", -1)]
    second = _run(spark, land, ck, [[("a", "x"), ("b", "x")]], already=4, initial=initial)
    assert second == [("a", 1), ("b", 1)]  # not 11 and 21: no key of the initial state came back
    # under the machine's temporary directory, one seed directory a run, gone when the process exits
    staged = sorted(p.name for p in temp.iterdir())
    assert len(staged) == 2 and all(n.startswith(seeds.SEED_DIR + "-") for n in staged), staged
    seeds.remove_staged()
    assert list(temp.iterdir()) == []


def test_duplicate_keys_in_the_initial_state_are_refused_in_one_line(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    initial = spark.createDataFrame([("a", 1), ("b", 2), ("a", 3)], "k string, value long")
    with pytest.raises(ConfigError, match=r"initial_state holds key 'a' more than once") as err:
        _query(spark, land, initial=initial)
    assert "\n" not in str(err.value)


def test_a_static_dataframe_starts_from_the_initial_state(spark):
    df = spark.createDataFrame([("a", "x"), ("a", "y"), ("c", "x")], "k string, v string")
    out = ss.map_groups_with_state(df, key="k", func=counter, state_type=int, output_type="k string, n long",
                                   engine="inband", initial_state=_initial(spark, a=10, b=20))
    assert sorted(tuple(r) for r in out.collect()) == [("a", 12), ("c", 1)]

