"""How many records a second the JSON parse with reasons types, at two limits of whole-stage code
generation: sparkstate's default (``spark.sql.codegen.hugeMethodLimit`` = 8000) and Spark's (65535).

HotSpot does not compile a method of more than 8,000 bytes of bytecode (``-XX:+DontCompileHugeMethods``
is its default) and runs it in its interpreter. The parse's stage, with its reasons for every field,
generates such a method; under Spark's limit it keeps it, under sparkstate's Spark runs that stage
without whole-stage code generation, in smaller methods that HotSpot compiles::

    python -m benchmarks.parse_rate                                  # sessionize's schema and a 20-field one
    python -m benchmarks.parse_rate --schema "a int, b string" --records 2000000

Each schema's records (generated JSON text, one value of each field) are cached in memory first;
each run types them all (``parse_json``'s events, written to Spark's ``noop`` sink) in one
session, the two limits in turn. It prints the median seconds and records a second per schema and
limit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import TYPE_CHECKING

from benchmarks.parse_plan import WIDE

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

LIMIT = "spark.sql.codegen.hugeMethodLimit"
#: Spark's own default of :data:`LIMIT`, beside sparkstate's (``sparkstate.spark.default_config``).
SPARKS_LIMIT = "65535"


def _value(kind: str, i: "Column") -> "Column":
    from pyspark.sql import functions as F

    if kind in ("tinyint", "smallint", "int", "bigint"):
        return (i % 100).cast(kind)
    if kind in ("float", "double"):
        return i / 3
    if kind == "boolean":
        return i % 7 == 0
    if kind in ("timestamp", "timestamp_ntz", "date"):
        return F.timestamp_seconds(i + 1_700_000_000).cast(kind)
    return F.concat(F.lit("u"), (i % 50_000).cast("string"))


def records(spark: "SparkSession", schema: str, n: int) -> "DataFrame":
    """``n`` JSON records of ``schema`` as a cached one-column frame ``value``."""
    from pyspark.sql import functions as F

    from sparkstate.io.parse import to_struct

    struct = to_struct(schema)
    fields = [_value(f.dataType.simpleString(), F.col("id")).alias(f.name) for f in struct.fields]
    frame = spark.range(n).select(F.to_json(F.struct(*fields)).alias("value")).cache()
    frame.count()
    return frame


def seconds(events: "DataFrame") -> float:
    """Seconds to type every record (the events written to the ``noop`` sink)."""
    started = time.perf_counter()
    events.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.parse_rate", description=__doc__.split("\n\n")[0])
    p.add_argument("--schema", action="append", help="a DDL schema (repeatable; default: sessionize's and a"
                   " 20-field one)")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    import sparkstate as ss
    from sparkstate.io.parse import parse_json
    from sparkstate.jobs.pipelines import JOB_PIPELINES
    from sparkstate.spark import default_config

    schemas = args.schema or [JOB_PIPELINES["sessionize"].schema, WIDE]
    spark = ss.spark_session("parse-rate")
    before = spark.conf.get(LIMIT)
    limits = {"sparkstate": default_config()[LIMIT], "spark": SPARKS_LIMIT}
    print(f"{'schema':44s} {'limit':>16s} {'median s':>9s} {'records/s':>10s}")
    for schema in schemas:
        frame = records(spark, schema, args.records)
        events = parse_json(frame, schema).events
        times: dict[str, list[float]] = {name: [] for name in limits}
        for _ in range(args.repeats + 1):  # the first round warms the JIT up and is dropped
            for name, limit in limits.items():
                spark.conf.set(LIMIT, limit)
                times[name].append(seconds(events))
        spark.conf.set(LIMIT, before)
        frame.unpersist()
        label = schema if len(schema) <= 44 else schema[:41] + "..."
        for name, limit in limits.items():
            median = statistics.median(times[name][1:])
            print(f"{label:44s} {name + ' ' + limit:>16s} {median:9.2f} {args.records / median:10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
