"""How long Spark takes to optimize and plan a JSON parse with reasons, for a schema.

A streaming query pays this in every micro-batch, one record or a million: Spark optimizes and
plans the whole query again for each batch. Here it is measured without a stream. The events and
the dead letters of ``sparkstate.io.parse.parse_json`` over a one-row DataFrame are planned again
and again, and the same is done with a bare ``from_json`` of the schema as the baseline::

    python -m benchmarks.parse_plan                                  # the ready pipelines' schemas
    python -m benchmarks.parse_plan --schema "a int, b string" --repeats 400

Each plan is made from scratch: the DataFrame's query execution, through its physical plan (the
analyzer's pass over the new projection, the optimizer, the planner and the preparation rules).
The driver does it alone, with no broker and no stream. It prints the median and the lower
quartile per schema, in ms. A loaded machine makes every plan slower: compare builds in runs made
back to back on a quiet one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: A wide schema beside the pipelines' own: 20 fields of the usual types.
WIDE = ", ".join(f"f{i} {t}" for i, t in enumerate(["string", "long", "double", "timestamp", "boolean"] * 4))


def parsed(spark: "SparkSession", schema: str) -> "DataFrame":
    """The events and the dead letters of ``parse_json`` over one record, as one frame of JSON text."""
    from pyspark.sql import functions as F

    from sparkstate.io.parse import parse_json

    raw = spark.createDataFrame([("{}", "here")], "value string, source string")
    p = parse_json(raw, schema, source=F.col("source"))
    return (p.events.select(F.to_json(F.struct("*")).alias("out"))
            .unionByName(p.dead_letters.select(F.to_json(F.struct("*")).alias("out"))))


def bare(spark: "SparkSession", schema: str) -> "DataFrame":
    """The baseline: the record typed by one ``from_json``, no reasons."""
    from pyspark.sql import functions as F

    raw = spark.createDataFrame([("{}",)], "value string")
    return raw.select(F.to_json(F.from_json("value", schema)).alias("out"))


def plan_ms(frame: "DataFrame", repeats: int, warmup: int) -> list[float]:
    """Milliseconds to make ``frame``'s physical plan from scratch, ``repeats`` times after ``warmup``."""

    def once() -> float:
        started = time.perf_counter()
        frame.select("*")._jdf.queryExecution().executedPlan()
        return (time.perf_counter() - started) * 1000

    for _ in range(warmup):
        once()
    return [once() for _ in range(repeats)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.parse_plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--schema", action="append", help="a DDL schema (repeatable; default: the ready pipelines' and a"
                   " 20-field one)")
    p.add_argument("--repeats", type=int, default=300)
    p.add_argument("--warmup", type=int, default=150)
    args = p.parse_args(argv)
    import sparkstate as ss
    from sparkstate.jobs.pipelines import JOB_PIPELINES

    schemas = args.schema or [*dict.fromkeys(pl.schema for pl in JOB_PIPELINES.values()), WIDE]
    spark = ss.spark_session("parse-plan", config={"spark.ui.enabled": "false"})
    kinds: dict[str, Callable[["SparkSession", str], "DataFrame"]] = {"parse_json": parsed, "from_json": bare}
    print(f"{'schema':44s} {'plan':>10s} {'median ms':>10s} {'p25 ms':>8s}")
    for schema in schemas:
        for kind, make in kinds.items():
            xs = plan_ms(make(spark, schema), args.repeats, args.warmup)
            label = schema if len(schema) <= 44 else schema[:41] + "..."
            print(f"{label:44s} {kind:>10s} {statistics.median(xs):10.2f} {statistics.quantiles(xs, n=4)[0]:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
