"""One streaming query, two outputs: the pipeline's rows to the sink, the dead letters beside them.

A job's dead letters come from two places: the parse step (malformed records, before the
pipeline) and the pipeline itself (records it refuses, e.g. sessionize's late events, which
only the stateful operator can recognise because only it knows the watermark of the
micro-batch). A streaming query has one sink, so the job runs ONE query whose rows are either
an output row or a dead letter (columns :data:`OUT` and :data:`DEAD`, one of them null), and
:class:`JobTee` (its ``foreachBatch`` function) writes each micro-batch's two parts to their
sinks. Both writers are idempotent per batch id, so a batch that Spark runs again after a crash
is written once, and both outputs of a batch come from one execution of it (the batch is
persisted while it is split).

Which job runs the batch depends on the output's sink. A sink that writes as the batch is
computed (Kafka: :func:`~sparkstate.io.writers.writes_uncounted`) is handed the output first, so
the job that runs the stateful stage also sends its results, as a bare streaming query would;
the dead letters and the counts are then taken from the persisted batch, and a job without
either runs nothing more. Every other sink is told the count of its part first (a file sink logs
an empty batch, Delta and PostgreSQL would commit an empty transaction), so the batch is run
and counted in one job and each part written after it: an empty part costs no job.

Each part goes through the writer of its sink's kind (:func:`sparkstate.io.writers.batch_writer`,
the one :func:`~sparkstate.io.sinks.start_sink` uses too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from pyspark.sql import functions as F

from ..io.writers import BatchWriter, write_counted, writes_uncounted

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: Column of the job's query holding an output row (a struct), null on dead letters.
OUT = "_sparkstate_out"
#: Column of the job's query holding a dead letter (raw, raw_bytes, reason, source, received_at), null on output rows.
DEAD = "_sparkstate_dead"


class JobTee:
    """The ``foreachBatch`` function of a job: split each micro-batch and write both parts.

    ``batch_df`` has the columns :data:`OUT` (a struct of the output row, or null) and
    :data:`DEAD` (a struct of the dead letter, or null). The batch is persisted while it is
    split, so the stateful part of the plan runs once per batch (see the module for which job runs it).
    """

    #: Batches whose counts :attr:`counted` keeps (the listener reads a batch's soon after it).
    KEEP = 64

    def __init__(self, output: BatchWriter, dead_letters: BatchWriter | None,
                 counts: Callable[[], list["Column"]] | None = None) -> None:
        """``counts``: when given, the output's counts (``rows``, and the named counts it returns,
        over the output's columns) are taken in the job that runs the batch and kept in
        :attr:`counted` by batch id: for a Spark that reports no observed metrics for a batch
        without input (PySpark 3.5: :func:`sparkstate.observe.metrics.batch_metrics` falls back on them)."""
        self.output = output
        self.dead_letters = dead_letters
        self.counts = counts
        # Written by the batches (one at a time), read by the listener's thread: single dict
        # operations, no lock (the tee is pickled as it is for Spark Connect's foreachBatch).
        self.counted: dict[int, dict[str, int]] = {}

    def counted_of(self, batch_id: int) -> dict[str, int] | None:
        """The output's counts of batch ``batch_id``, when this tee took them."""
        return self.counted.get(batch_id)

    def __call__(self, batch_df: "DataFrame", batch_id: int) -> None:
        output = batch_df.where(f"{OUT} IS NOT NULL").select(f"{OUT}.*")
        first = writes_uncounted(self.output)
        if first and self.dead_letters is None and self.counts is None:
            self.output(output, batch_id)  # one job runs the batch (every partition) and sends its output
            return
        batch_df.persist()
        try:
            if first:
                # The job that runs the batch sends the output as it goes; the rest reads the persisted batch.
                self.output(output, batch_id)
            out_rows, dead_rows = self._count(batch_df, batch_id)
            if self.dead_letters is not None:
                write_counted(self.dead_letters, batch_df.where(f"{DEAD} IS NOT NULL").select(f"{DEAD}.*"),
                              batch_id, dead_rows)
            if not first:
                write_counted(self.output, output, batch_id, out_rows)
        finally:
            batch_df.unpersist()

    def _count(self, batch_df: "DataFrame", batch_id: int) -> tuple[int, int]:
        """The rows of the batch's two parts, output and dead letters, in one job (the one that runs
        the batch, unless the output was sent first: every partition, so every state store commits,
        even when both writers skip a replay); with :attr:`counts`, the output's counts are kept in
        :attr:`counted`. Written as SQL text: one call into the JVM per step, not one per column object."""
        if self.counts is None:
            out_rows, dead_rows = batch_df.selectExpr(f"count({OUT})", f"count({DEAD})").collect()[0]
            return int(out_rows), int(dead_rows)
        row = batch_df.select(OUT, DEAD, f"{OUT}.*").agg(
            F.count(OUT).alias("rows"), F.count(DEAD).alias("dead"), *self.counts()).collect()[0]
        self.counted[batch_id] = {k: int(v) for k, v in row.asDict().items() if k != "dead"}
        for old in [b for b in list(self.counted) if b <= batch_id - self.KEEP]:
            self.counted.pop(old, None)
        return int(row["rows"]), int(row["dead"])


__all__ = ["DEAD", "OUT", "JobTee"]
