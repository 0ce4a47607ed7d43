"""What is measured: every contender of a workload, built on the same streaming input.

A contender turns the input stream into the output DataFrame that the runner writes to the
noop sink. Running count (``count``): native ``groupBy().count()``, ``mapGroupsWithState`` in
Java (the reference), raw PySpark ``transformWithState`` and ``applyInPandasWithState``, and
``ss.map_groups_with_state`` once per engine in ``sparkstate.engines.ENGINES``, and
``ss.map_batches_with_state`` (``sparkstate-vectorized``: the count over pandas columns). Sessionization
(``sessions``): a Java ``flatMapGroupsWithState`` sessionizer (the reference), raw PySpark
``transformWithState`` and ``applyInPandasWithState`` sessionizers, and
``sparkstate.pipelines.sessionize`` (once per engine when it takes ``engine=``). Engines are
discovered when the list is built, so a new one is benchmarked without touching this file.

A contender whose Spark API the installed PySpark lacks (``transformWithState`` before 4.1, the
engines on it: :data:`ENGINE_NEEDS`) is left out of the list, so the same command runs on every
minor (``--pyspark 3.5``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Literal, Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkstate.engines import runtime

from . import pyspark_raw as raw
from .data import Scaling, Workload, key_width

Family = Literal["jvm", "pyspark", "sparkstate"]
#: Spark's built-in stateful operators, (flat)mapGroupsWithState and applyInPandasWithState
#: refuse the Avro state encoding (transformWithState takes both): pinned, whatever --conf says.
UNSAFEROW = {"spark.sql.streaming.stateStore.encodingFormat": "unsaferow"}
#: The first PySpark minor with the Spark API each engine runs on (the engine refuses older ones
#: in one line; here they are left out of the list). An engine not named runs on every minor.
ENGINE_NEEDS = {"tws": runtime.TRANSFORM_WITH_STATE_ROWS, "batched": runtime.TRANSFORM_WITH_STATE_IN_PANDAS}


@dataclass(frozen=True)
class Context:
    spark: SparkSession
    workload: Workload | Scaling


@dataclass(frozen=True)
class Contender:
    name: str
    workload: str
    family: Family
    description: str
    #: ``build(ctx, input) -> output``; the output is written to the noop sink.
    build: Callable[[Context, DataFrame], DataFrame]
    output_mode: str
    #: Spark settings this contender needs on top of the common ones (set for its query only).
    conf: Mapping[str, str] = field(default_factory=dict)
    reference: bool = False
    #: Scaling run: ``build_initial(ctx, input, initial)`` preloads state from ``initial``
    #: (``user string, count long``); without it (or when it refuses one on this minor) the state
    #: is preloaded by the first micro-batches.
    build_initial: Callable[[Context, DataFrame, DataFrame], DataFrame] | None = None
    #: In the scaling run unless named with --contenders (a slow first-batch preload is not).
    in_scaling: bool = True
    #: Run when no --contenders are named (a comparison contender runs only when named).
    by_default: bool = True
    #: The first PySpark minor with the Spark API it runs on (None: every supported minor).
    needs: tuple[int, int] | None = None

    @property
    def available(self) -> bool:
        """Whether the installed PySpark has what this contender runs on."""
        return self.needs is None or runtime.has(self.needs)


def _java(ctx: Context):
    jvm = ctx.spark._jvm
    return jvm.sparkstate.bench


def _wrap(ctx: Context, jdf: Any) -> DataFrame:
    return DataFrame(jdf, ctx.spark)


# -- running count ----------------------------------------------------------------------------

def count_per_key(user: str, rows: Any, state: Any) -> tuple:
    """The sparkstate contender's function: the running count of ``user``."""
    total = (state.getOption or 0) + sum(1 for _ in rows)
    state.update(total)
    return (user, total)


def _native_count(ctx: Context, df: DataFrame) -> DataFrame:
    return df.groupBy("user").count()


def _java_count(ctx: Context, df: DataFrame) -> DataFrame:
    return _wrap(ctx, _java(ctx).RunningCount.apply(df._jdf, "user"))


def _java_count_initial(ctx: Context, df: DataFrame, initial: DataFrame) -> DataFrame:
    return _wrap(ctx, _java(ctx).RunningCount.withInitialState(df._jdf, "user", initial._jdf))


def _tws_count(ctx: Context, df: DataFrame, initial: DataFrame | None = None) -> DataFrame:
    return df.groupBy("user").transformWithState(
        raw.TwsCounter(), raw.COUNT_OUTPUT, "Update", "None",
        initialState=None if initial is None else initial.groupBy("user"))


def _pandas_count(ctx: Context, df: DataFrame) -> DataFrame:
    return df.groupBy("user").applyInPandasWithState(raw.pandas_count, raw.COUNT_OUTPUT, raw.COUNT_STATE, "update",
                                                     "NoTimeout")


def _sparkstate_count(engine: str) -> tuple[Callable, Callable]:
    import sparkstate as ss

    def build(ctx: Context, df: DataFrame) -> DataFrame:
        return ss.map_groups_with_state(df, key="user", func=count_per_key, state_type=int,
                                        output_type=raw.COUNT_OUTPUT, engine=engine)

    def build_initial(ctx: Context, df: DataFrame, initial: DataFrame) -> DataFrame:
        return ss.map_groups_with_state(df, key="user", func=count_per_key, state_type=int,
                                        output_type=raw.COUNT_OUTPUT, engine=engine,
                                        initial_state=initial.withColumnRenamed("count", "value"))

    return build, build_initial


def count_per_batch(batch: Any) -> Any:
    """The vectorized contender's function: the running counts of a bucket's users, over columns."""
    import sparkstate as ss

    import numpy as np

    s = batch.state[["user", "value"]]
    s = s.assign(value=s["value"].fillna(0) + np.bincount(batch.key_index, minlength=len(s)))
    return ss.StateUpdate(state=s, output=s.rename(columns={"value": "count"}))


def _vectorized_count() -> tuple[Callable, Callable]:
    import sparkstate as ss

    def build(ctx: Context, df: DataFrame) -> DataFrame:
        return ss.map_batches_with_state(df, key="user", func=count_per_batch, state_type=int,
                                         output_type=raw.COUNT_OUTPUT)

    def build_initial(ctx: Context, df: DataFrame, initial: DataFrame) -> DataFrame:
        return ss.map_batches_with_state(df, key="user", func=count_per_batch, state_type=int,
                                         output_type=raw.COUNT_OUTPUT,
                                         initial_state=initial.withColumnRenamed("count", "value"))

    return build, build_initial


# -- sessionization ---------------------------------------------------------------------------

def session_input(df: DataFrame, w: Workload) -> DataFrame:
    """What ``sessionize`` hands its operator: watermark, no null times, four columns."""
    return (df.withWatermark("event_time", f"{w.watermark_ms} milliseconds")
            .where(F.col("event_time").isNotNull())
            .select("user_id", "event_time", F.col("data").cast("string"),
                    F.coalesce(F.col("is_last"), F.lit(False)).alias("is_last")))


SESSION_OUTPUT = ("user_id string, session_start timestamp, session_end timestamp, event_count long,"
                  " events array<string>, closed_by string")


def _java_sessions(ctx: Context, df: DataFrame) -> DataFrame:
    w = ctx.workload
    return _wrap(ctx, _java(ctx).Sessionizer.apply(session_input(df, w)._jdf, w.gap_ms))


def _tws_sessions(ctx: Context, df: DataFrame) -> DataFrame:
    w = ctx.workload
    return session_input(df, w).groupBy("user_id").transformWithState(
        raw.TwsSessionizer(w.gap_ms), SESSION_OUTPUT, "Append", "EventTime")


def _pandas_sessions(ctx: Context, df: DataFrame) -> DataFrame:
    w = ctx.workload
    return session_input(df, w).groupBy("user_id").applyInPandasWithState(
        raw.PandasSessionizer(w.gap_ms), SESSION_OUTPUT, raw.PANDAS_SESSION_STATE, "append", "EventTimeTimeout")


def _sparkstate_sessions(engine: Any, emit: bool = False) -> Callable:
    from sparkstate.pipelines import sessionize

    def build(ctx: Context, df: DataFrame) -> DataFrame:
        w = ctx.workload
        extra = {} if engine is None else {"engine": engine}
        if emit:
            extra["late"] = "emit"
        out = sessionize(df, key="user_id", timestamp="event_time", gap=timedelta(milliseconds=w.gap_ms),
                         last_flag="is_last", time_mode="event", watermark=timedelta(milliseconds=w.watermark_ms),
                         data="data", **extra)
        return out.where(F.col("rejected").isNull()).drop("rejected") if emit else out

    return build


try:  # the batched engine without the columnar sessionizer (its per-key loop), to compare the two
    from sparkstate.engines.batched.engine import BatchedEngine
    from sparkstate.engines.batched.processor import BucketProcessor

    class PerKeyProcessor(BucketProcessor):
        """The batched engine's per-key processor, under another name, so that a group function's
        own columnar processor is not used (``BatchedEngine.apply``)."""

    class PerKeyEngine(BatchedEngine):
        processor_class = PerKeyProcessor

    per_key_engine: Any = PerKeyEngine()
except ImportError:  # an older sparkstate
    per_key_engine = None


def sessionize_takes_engine() -> bool:
    from sparkstate.pipelines import sessionize

    return "engine" in inspect.signature(sessionize).parameters


def engines() -> list[str]:
    from sparkstate.engines import ENGINES

    return list(ENGINES)


# -- the registry -----------------------------------------------------------------------------

def contenders(workload: str, every_minor: bool = False) -> list[Contender]:
    """The contenders of ``workload`` (``count`` or ``sessions``) the installed PySpark runs, the
    JVM ones first (``every_minor``: those it lacks too, :attr:`Contender.available` false)."""
    found = _registry(workload)
    return found if every_minor else [c for c in found if c.available]


def _registry(workload: str) -> list[Contender]:
    tws_rows, tws_pandas = runtime.TRANSFORM_WITH_STATE_ROWS, runtime.TRANSFORM_WITH_STATE_IN_PANDAS
    if workload == "count":
        found = [
            Contender("native-count", "count", "jvm", "groupBy(user).count() (Spark SQL, JVM)",
                      _native_count, "update", conf=UNSAFEROW),
            Contender("java-mgws", "count", "jvm", "mapGroupsWithState in Java, Long state",
                      _java_count, "update", conf=UNSAFEROW, reference=True, build_initial=_java_count_initial),
            Contender("pyspark-tws", "count", "pyspark", "raw PySpark transformWithState (Row API), one ValueState",
                      _tws_count, "update", build_initial=_tws_count, needs=tws_rows),
            Contender("pyspark-pandas", "count", "pyspark", "raw PySpark applyInPandasWithState",
                      _pandas_count, "update", conf=UNSAFEROW, in_scaling=False),
        ]
        for name in engines():
            build, build_initial = _sparkstate_count(name)
            found.append(Contender(f"sparkstate-{name}", "count", "sparkstate",
                                   f'ss.map_groups_with_state(..., engine="{name}")', build, "update",
                                   build_initial=build_initial, needs=ENGINE_NEEDS.get(name)))
        build, build_initial = _vectorized_count()
        found.append(Contender("sparkstate-vectorized", "count", "sparkstate",
                               "ss.map_batches_with_state (one pandas call per bucket)", build, "update",
                               build_initial=build_initial, needs=ENGINE_NEEDS["batched"]))
        return found
    if workload == "sessions":
        found = [
            Contender("java-fmgws", "sessions", "jvm", "flatMapGroupsWithState sessionizer in Java, event time",
                      _java_sessions, "append", conf=UNSAFEROW, reference=True),
            Contender("pyspark-tws", "sessions", "pyspark", "raw PySpark transformWithState sessionizer, event time",
                      _tws_sessions, "append", needs=tws_rows),
            Contender("pyspark-pandas", "sessions", "pyspark", "raw PySpark applyInPandasWithState sessionizer,"
                      " event-time timeout", _pandas_sessions, "append", conf=UNSAFEROW),
        ]
        if sessionize_takes_engine():
            for name in engines():
                found.append(Contender(f"sparkstate-{name}", "sessions", "sparkstate",
                                       f'sparkstate.pipelines.sessionize(..., engine="{name}")',
                                       _sparkstate_sessions(name), "append", needs=ENGINE_NEEDS.get(name)))
            found.append(Contender("sparkstate-emit", "sessions", "sparkstate",
                                   "sessionize(late=\"emit\") as `sparkstate run` runs it (late rows out with a"
                                   " reason; the input packed), its sessions", _sparkstate_sessions(None, emit=True),
                                   "append", by_default=False))
            if per_key_engine is not None:  # the batched engine is there
                found.append(Contender("sparkstate-emit-nopack", "sessions", "sparkstate",
                                       "sessionize(late=\"emit\") without the packing step (`sparkstate run"
                                       " sessionize`'s default since 2026-11-29), its sessions",
                                       _sparkstate_sessions(BatchedEngine(pack=False), emit=True), "append",
                                       by_default=False, needs=tws_pandas))
                found.append(Contender("sparkstate-perkey", "sessions", "sparkstate",
                                       "sessionize on the batched engine's per-key loop (before the columnar"
                                       " sessionizer)", _sparkstate_sessions(per_key_engine), "append",
                                       by_default=False, needs=tws_pandas))
        else:
            found.append(Contender("sparkstate-sessionize", "sessions", "sparkstate",
                                   "sparkstate.pipelines.sessionize(time_mode='event') (its default engine)",
                                   _sparkstate_sessions(None), "append"))
        return found
    raise ValueError(f"unknown workload {workload!r}; expected count or sessions")


def select(found: list[Contender], names: list[str] | None) -> list[Contender]:
    """Contenders whose name starts with one of ``names`` (those run by default when ``names`` is empty)."""
    if not names:
        return [c for c in found if c.by_default]
    return [c for c in found if any(c.name.startswith(n) for n in names)]


def initial_counts(spark: SparkSession, s: Scaling) -> DataFrame:
    """The preloaded state of the scaling run: every key once, ``user string, count long``."""
    digits = F.lpad(F.col("id").cast("string"), key_width(s.state_keys), "0")
    return spark.range(s.state_keys).select(F.concat(F.lit("u"), digits).alias("user"),
                                            F.lit(1).cast("long").alias("count"))
