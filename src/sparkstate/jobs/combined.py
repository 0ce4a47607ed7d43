"""The job's one streaming DataFrame: the pipeline's output rows and the dead letters, merged.

Each row is either an output row (column :data:`~sparkstate.jobs.tee.OUT`) or a dead letter
(:data:`~sparkstate.jobs.tee.DEAD`): records the source could not parse, and records the
pipeline refused (late events, ...), in the dead-letter schema; a pipeline that refuses the
malformed records itself (:attr:`~sparkstate.jobs.pipelines.Refusals.malformed`) is given them
with their reason, and the query reads its source once. The counts a job reports are
observed here (``DataFrame.observe``): records in, rows out, dead letters, late events.
:class:`~sparkstate.jobs.tee.JobTee` writes each micro-batch's two parts to their sinks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from ..columns import batch_time
from ..io.parse import DEAD_LETTER_SCHEMA, RAW, REASON, RECEIVED_AT, SOURCE, dead_letter_raw, to_struct
from ..observe.metrics import DEAD_LETTER_OBSERVATION, OUTPUT_OBSERVATION
from .pipelines import JobPipeline, Refusals
from .settings import SettingValues
from .tee import DEAD, OUT

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def pipeline_input(source: Any, pipeline: JobPipeline, config: SettingValues, *,
                   one_read: bool = True) -> tuple["DataFrame", "DataFrame | None"]:
    """What the pipeline is given, and the dead letters the query reads beside it (``None``: none).

    A pipeline that refuses records gets each record's raw bytes and origin (:data:`CARRY`: bytes, as
    a record's text may hold invalid UTF-8, which Python could not take as a string); one
    that refuses malformed records itself (:attr:`Refusals.malformed`) gets every record, with
    the parse's reason (null on a good one), and the query reads the source once. Otherwise, or
    without ``one_read`` (a checkpoint whose query read the source twice), the pipeline gets the
    good records, and the source's dead letters are a second read of it; a pipeline that refuses
    only malformed records (not :attr:`Refusals.own`) then gets the source's events as they are,
    and otherwise their bytes and origin only on the records it refuses.
    """
    refusals = pipeline.refusals
    if refusals is None or source.checked is None:
        return source.events, source.dead_letters
    reason = F.col(REASON)
    malformed = one_read and refusals.malformed is not None and refusals.malformed(config)
    if not (malformed or refusals.own):
        return source.events, source.dead_letters
    # A refused record's fields go to the pipeline null: they may hold what Spark types and Python
    # cannot take (a timestamp of the year 0), and the pipeline refuses the record by its reason.
    cols = [F.col(f"`{n}`") if not malformed else F.when(reason.isNull(), F.col(f"`{n}`")).alias(n)
            for n in source.schema.fieldNames()]
    carried = [F.col(RAW).cast("binary"), F.col(SOURCE)]
    if not refusals.own:  # it refuses only malformed records: only their bytes cross to Python
        carried = [F.when(reason.isNotNull(), c) for c in carried]
    cols += [carried[0].alias(RAW), carried[1].alias(SOURCE)]
    if malformed:
        return source.checked.select(*cols, reason), None
    return source.checked.where(reason.isNull()).select(*cols), source.dead_letters


def _refused_as_dead(output: "DataFrame", refusals: Refusals, key: str, origin: str,
                     max_record_bytes: int) -> "Column":
    """A refused output row (non-null ``refusals.column``) as a dead letter (raw, raw_bytes, reason, source,
    received_at), as the parse writes one (:func:`~sparkstate.io.parse.dead_letter_raw`).

    ``raw`` is the record as read when the pipeline carried it (null for a record without a value, a
    Kafka tombstone: as the parse's own dead letter), else the refused event as JSON (``key`` is the
    output's key column); ``source`` where it came from, else ``origin``.
    """
    col = refusals.column
    names = output.schema[col].dataType.fieldNames()  # type: ignore[attr-defined]
    if RAW in names:  # the record's bytes (null: a record without a value), as Spark's string of them
        raw = F.col(f"{col}.`{RAW}`").cast("string")  # (dead_letter_raw makes it valid text)
    else:
        raw = F.to_json(F.struct(F.col(key), *[F.col(f"{col}.`{n}`") for n in refusals.event]))
    where = F.col(f"{col}.`{SOURCE}`") if SOURCE in names else F.lit(None).cast("string")
    text, data = dead_letter_raw(raw, max_record_bytes)
    return F.struct(
        text.alias("raw"),
        data.alias("raw_bytes"),
        F.col(f"{col}.`{refusals.reason}`").alias("reason"),
        F.coalesce(where, F.lit(origin)).alias("source"),
        batch_time().alias(RECEIVED_AT),
    )


def _refusals(output: "DataFrame", pipeline: JobPipeline) -> Refusals | None:
    """The pipeline's :class:`Refusals` when its output has that struct column, else ``None``."""
    r = pipeline.refusals
    if r is None or r.column not in output.columns or not isinstance(output.schema[r.column].dataType, StructType):
        return None
    return r


def _output_counts(refusals: Refusals | None, is_out: "Column", pipeline: JobPipeline) -> list["Column"]:
    """What the job observes on the output: rows, the pipeline's own counts, refused and late records."""
    counts = [F.count(F.when(is_out, 1)).alias("rows")] + (pipeline.observe() if pipeline.observe else [])
    if refusals is not None:
        counts.append(F.count(F.col(refusals.column)).alias("rejected"))
        if refusals.late:
            reason = F.col(f"{refusals.column}.`{refusals.reason}`")
            counts.append(F.count(F.when(reason.startswith(refusals.late), 1)).alias("late"))
    return counts


def combined_stream(output: "DataFrame", dead_letters: "DataFrame | None", pipeline: JobPipeline,
                    origin: str, max_record_bytes: int) -> tuple["DataFrame", StructType, bool]:
    """The job's one streaming DataFrame (:data:`OUT` | :data:`DEAD` per row), the output's schema,
    and whether the pipeline may refuse records. ``dead_letters``: the source's, read beside the
    pipeline (``None`` when there are none, or the pipeline refuses them itself)."""
    refusals = _refusals(output, pipeline)
    out_cols = [c for c in output.columns if refusals is None or c != refusals.column]
    is_out = F.col(refusals.column).isNull() if refusals is not None else F.lit(True)
    output = output.observe(OUTPUT_OBSERVATION, *_output_counts(refusals, is_out, pipeline))
    out_schema = StructType([output.schema[c] for c in out_cols])
    dead_col = (F.when(~is_out, _refused_as_dead(output, refusals, out_cols[0], origin, max_record_bytes))
                if refusals is not None
                else F.lit(None).cast(to_struct(DEAD_LETTER_SCHEMA)))
    combined = output.select(F.when(is_out, F.struct(*[F.col(f"`{c}`") for c in out_cols])).alias(OUT),
                             dead_col.alias(DEAD))
    if dead_letters is not None:
        dead = _observed_dead_letters(dead_letters)
        combined = combined.unionByName(dead.select(F.lit(None).cast(out_schema).alias(OUT),
                                                    F.struct(*[F.col(c) for c in dead.columns]).alias(DEAD)))
    return combined, out_schema, refusals is not None


def _observed_dead_letters(dead_letters: "DataFrame") -> "DataFrame":
    """The source's dead letters, counted (:data:`DEAD_LETTER_OBSERVATION`)."""
    return dead_letters.observe(DEAD_LETTER_OBSERVATION, F.count(F.lit(1)).alias("rows"))


__all__ = ["combined_stream", "pipeline_input"]
