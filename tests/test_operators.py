"""Definition-time validation of the operators: every misuse fails before any data arrives."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import pytest

import sparkstate as ss


@pytest.fixture
def events(spark):
    return (spark.readStream.format("rate").option("rowsPerSecond", 1).load()
            .selectExpr("CAST(value % 3 AS STRING) AS user_id", "timestamp AS event_time", "value"))


@dataclass
class Counter:
    n: int = 0


def noop(key, values, state):
    return None


def define(df, **kw):
    args = dict(key="user_id", func=noop, state_type=Counter, output_type="user_id string")
    args.update(kw)
    return ss.map_groups_with_state(df, **args)


def test_event_time_timeout_without_watermark_fails_at_definition(events):
    with pytest.raises(ss.TimeoutConfigError, match=r"EventTimeTimeout needs an event-time watermark.*withWatermark"):
        define(events, timeout=ss.GroupStateTimeout.EventTimeTimeout)


def test_event_time_timeout_with_watermark_is_accepted(events):
    out = define(events.withWatermark("event_time", "10 seconds"), timeout="EventTimeTimeout")
    assert out.isStreaming and out.columns == ["user_id"]


def test_unknown_key_column_names_the_columns(events):
    with pytest.raises(ss.SparkStateError, match=r"key column\(s\) 'user' not in the input; its columns are user_id, event_time, value"):
        define(events, key="user")


def test_key_must_be_names(events):
    with pytest.raises(ss.SparkStateError, match="key must be a column name or a list of column names, got 3"):
        define(events, key=3)


@dataclass
class BadState:
    ok: int
    bad: set


def test_state_type_that_cannot_be_encoded_names_the_field(events):
    with pytest.raises(ss.StateTypeError, match=r"state_type\.bad: type <class 'set'> cannot be stored"):
        define(events, state_type=BadState)


@dataclass
class Reserved:
    _sparkstate_timeout_ms: int


def test_reserved_field_names_are_refused(events):
    with pytest.raises(ss.StateTypeError, match="reserved prefix '_sparkstate_'"):
        define(events, state_type=Reserved)


def test_bad_output_type(events):
    with pytest.raises(ss.StateTypeError, match="output_type: expected a dataclass, a StructType or a DDL string of columns, got int"):
        define(events, output_type=int)
    with pytest.raises(ss.StateTypeError, match="is not a valid DDL schema"):
        define(events, output_type="user_id strin g,,")


def test_bad_timeout_name(events):
    with pytest.raises(ss.TimeoutConfigError, match="timeout: expected one of NoTimeout, ProcessingTimeTimeout, EventTimeTimeout"):
        define(events, timeout="Sometimes")


def test_bad_output_mode(events):
    with pytest.raises(ss.SparkStateError, match="output_mode must be 'update' or 'append', got 'complete'"):
        define(events, output_mode="complete")


def test_state_ttl_rules(events):
    with pytest.raises(ValueError, match="state_ttl: expected a positive duration"):
        define(events, state_ttl="0 seconds")
    with pytest.raises(ValueError, match="expected a duration such as"):
        define(events, state_ttl="soon")
    with pytest.raises(ss.TimeoutConfigError, match="state_ttl is measured in processing time"):
        define(events.withWatermark("event_time", "1 minute"), state_ttl="1 hour",
               timeout=ss.GroupStateTimeout.EventTimeTimeout)


@dataclass
class Click:
    user_id: str
    page: str


def test_value_type_must_match_the_input(events):
    with pytest.raises(ss.StateTypeError, match=r"value_type Click does not match the input: field 'page' has no column"):
        define(events, value_type=Click)


@dataclass
class Typed:
    user_id: str
    value: str


def test_value_type_field_types_are_checked(events):
    with pytest.raises(ss.StateTypeError, match="field 'value' is string but the column is bigint"):
        define(events, value_type=Typed)


def test_initial_state_missing_state_fields(spark, events):
    initial = spark.createDataFrame([("1", 5)], "user_id string, count long")
    with pytest.raises(ss.SparkStateError, match=r"initial_state must have the key column\(s\) and the state's fields: missing 'n'; it has user_id, count"):
        define(events, initial_state=initial)


def test_initial_state_of_a_primitive_needs_value(spark, events):
    initial = spark.createDataFrame([("1", 5)], "user_id string, count long")
    with pytest.raises(ss.SparkStateError, match="and a column `value`: missing 'value'"):
        define(events, state_type=int, initial_state=initial)


def test_initial_state_must_be_static(events):
    with pytest.raises(ss.SparkStateError, match="initial_state must be a static DataFrame"):
        define(events, initial_state=events.select("user_id", events.value.alias("n")))


def test_func_must_be_callable(events):
    with pytest.raises(ss.SparkStateError, match="func must be callable"):
        define(events, func="noop")


def test_input_must_be_a_dataframe():
    with pytest.raises(ss.SparkStateError, match="expected a pyspark DataFrame as input, got list"):
        define([1, 2])


def test_map_with_state_misuse(events):
    spec = ss.StateSpec.function(lambda k, v, s: None)
    with pytest.raises(ss.SparkStateError, match="value column 'nope' not in the input"):
        ss.map_with_state(events, key="user_id", value="nope", spec=spec, state_type=int, output_type="a long")
    with pytest.raises(ss.SparkStateError, match=r"spec must be ss.StateSpec.function\(func\)"):
        ss.map_with_state(events, key="user_id", value="value", spec=lambda: 0, state_type=int, output_type="a long")
    with pytest.raises(ss.SparkStateError, match="pass either value"):
        ss.map_with_state(events, key="user_id", value="value", spec=spec, state_type=int,
                          output_type="a long", value_type=Click)


def test_num_partitions_warns_that_it_applies_to_new_checkpoints(spark, events, caplog):
    spec = ss.StateSpec.function(lambda k, v, s: None).num_partitions(3)
    try:
        with caplog.at_level("WARNING", logger="sparkstate"):
            ss.map_with_state(events, key="user_id", value="value", spec=spec, state_type=int, output_type="a long")
        assert spark.conf.get("spark.sql.shuffle.partitions") == "3"
        assert "takes effect for a new checkpoint only" in caplog.text
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")


def test_update_state_by_key_output_columns(events):
    out = ss.update_state_by_key(events, key="user_id", value="value", func=lambda new, s: s, state_type=int)
    assert out.columns == ["user_id", "value"]
    out = ss.update_state_by_key(events, key="user_id", value=None, func=lambda new, s: s, state_type=Typed)
    assert out.columns == ["user_id", "value"]  # the state's own user_id is the key column


def test_engine_name_is_checked(events):
    with pytest.raises(ss.SparkStateError, match="engine: expected one of batched, inband, tws, got 'turbo'"):
        define(events, engine="turbo")


def test_session_without_rocksdb_is_fixed_with_a_warning(spark, events):
    from sparkstate import spark as session_mod

    key = "spark.sql.streaming.stateStore.providerClass"
    before = spark.conf.get(key)
    session_mod._checked.discard(id(spark))
    spark.conf.set(key, "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            define(events)
            define(events)  # said once, not at every operator
        messages = [str(w.message) for w in caught if "sparkstate" in str(w.message)]
        assert len(messages) == 1 and "RocksDB" in messages[0]
        assert spark.conf.get(key) == session_mod.ROCKSDB_PROVIDER
    finally:
        spark.conf.set(key, before)
