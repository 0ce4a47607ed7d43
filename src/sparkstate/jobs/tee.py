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
the job that runs the stateful stage also sends its results, as a bare streaming query would.
The same job counts both parts (an observation in the written frame, which Spark reports for the
Kafka writer's V2 write: :func:`~sparkstate.io.kafka.through_v2`), and the dead letters are
then written from the persisted batch: one job per batch, a second only for a batch with dead
letters to send. Over Spark Connect the counts stay a job of their own on the persisted batch
(the observation of the V2 write is measured on classic sessions: PySpark 3.5, 4.0 and 4.3).
Every other sink is told the count of its part first (a file sink logs an empty batch, Delta
and PostgreSQL would commit an empty transaction), so the batch is run and counted in one job
and each part written after it: an empty part costs no job.

A job whose output and dead letters both go to Kafka on one broker does not use the tee:
its query writes straight to Kafka (:mod:`sparkstate.jobs.run`, ``_kafka_records``).

Each part goes through the writer of its sink's kind (:func:`sparkstate.io.writers.batch_writer`,
the one :func:`~sparkstate.io.sinks.start_sink` uses too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from pyspark.sql import Observation
from pyspark.sql import functions as F

from ..io.files import FileSinkLog
from ..io.writers import BatchWriter, write_counted, writes_uncounted
from ..spark import is_connect

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
        first = writes_uncounted(self.output)
        if first and self.dead_letters is None and self.counts is None:
            self.output(_output_rows(batch_df), batch_id)  # one job runs the batch and sends its output
            return
        batch_df.persist()
        try:
            if first and not is_connect(batch_df.sparkSession):
                # The job that runs the batch sends the output and counts both parts as it goes.
                observation = Observation()
                self.output(_output_rows(self._counted_frame(batch_df).observe(observation, *self._aggregates())),
                            batch_id)
                out_rows, dead_rows = self._keep(batch_id, observation.get)
            else:
                if first:  # over Connect: the output is sent, then counted from the persisted batch
                    self.output(_output_rows(batch_df), batch_id)
                out_rows, dead_rows = self._keep(
                    batch_id, self._counted_frame(batch_df).agg(*self._aggregates()).collect()[0].asDict())
            if self.dead_letters is not None:
                write_counted(self.dead_letters, batch_df.where(f"{DEAD} IS NOT NULL").select(f"{DEAD}.*"),
                              batch_id, dead_rows)
            if not first:
                write_counted(self.output, _output_rows(batch_df), batch_id, out_rows)
        finally:
            batch_df.unpersist()

    def flush(self) -> None:
        """Wait until both writers hold everything they were given (a file sink writes an empty
        batch's log entry in the background: :class:`~sparkstate.io.files.FileSinkLog`)."""
        for writer in (self.output, self.dead_letters):
            if isinstance(writer, FileSinkLog):
                writer.flush()

    def _counted_frame(self, batch_df: "DataFrame") -> "DataFrame":
        """``batch_df`` with the output's own columns beside :data:`OUT` and :data:`DEAD` when
        :attr:`counts` needs them."""
        return batch_df if self.counts is None else batch_df.select(OUT, DEAD, f"{OUT}.*")

    def _aggregates(self) -> list["Column"]:
        """The counts of a batch's two parts (``rows``: output rows, ``dead``: dead letters) and,
        with :attr:`counts`, the output's named counts, over the columns :data:`OUT`, :data:`DEAD`
        and the output's own."""
        return [F.count(OUT).alias("rows"), F.count(DEAD).alias("dead"), *(self.counts() if self.counts else [])]

    def _keep(self, batch_id: int, counted: dict[str, Any]) -> tuple[int, int]:
        """The rows of the output and of the dead letters, from the values of :meth:`_aggregates`;
        with :attr:`counts`, the output's counts are kept in :attr:`counted`."""
        values = {k: int(v) for k, v in counted.items()}
        if self.counts is not None:
            self.counted[batch_id] = {k: v for k, v in values.items() if k != "dead"}
            for old in [b for b in list(self.counted) if b <= batch_id - self.KEEP]:
                self.counted.pop(old, None)
        return values["rows"], values["dead"]


def _output_rows(batch_df: "DataFrame") -> "DataFrame":
    """The output rows of a batch (or of a frame with the column :data:`OUT`), as the output's columns."""
    return batch_df.where(f"{OUT} IS NOT NULL").select(f"{OUT}.*")


__all__ = ["DEAD", "OUT", "JobTee"]
