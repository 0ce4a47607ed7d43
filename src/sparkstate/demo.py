"""The demo job: generated clicks -> event-time sessionization -> Parquet, checked against the truth.

What ``sparkstate demo`` runs, as one library call. The generator writes its events into
``OUT/input`` as several JSON-lines files; the ``sessionize`` job
(:func:`~sparkstate.jobs.run_pipeline`, as ``sparkstate run sessionize --once`` runs it) reads
them one file per micro-batch and writes the sessions to ``OUT/sessions`` (Parquet, Spark's
exactly-once file sink) with the checkpoint in ``OUT/checkpoint``. The run ends once all files
are processed and the last watermark advance has fired its timeouts (the job is caught up).

How it ends, honestly: no fake "end of input" event is injected. A session is written once it
is finished; the sessions whose end + gap the final watermark (the latest event time minus the
watermark delay) has not yet passed are *still open*: they stay in the state store, are not in
the output, and are reported as open. The written sessions are compared with the generator's
reference sessions finished by that same watermark (:func:`~sparkstate.synthetic.reference_sessions`).

With ``kafka=`` (``sparkstate demo --kafka``) the same events also go, in the same order, to a
one-partition topic of a Kafka broker, and the job reads the topic instead of the files
(``kafka:`` source, as many offsets per micro-batch as a file holds): same batches, same
sessions, same check.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .durations import Duration
from .errors import ConfigError
from .jobs import JobConfig, JobResult, run_pipeline
from .synthetic import Session, generate_events, reference_sessions, write_events

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .observe.metrics import BatchMetrics, RunTotals

#: Marks a directory as made by the demo, so a new run may clear its old subdirectories.
MARKER = ".sparkstate-demo"
SUBDIRS = ("input", "sessions", "checkpoint")


@dataclass(frozen=True)
class BatchInfo:
    """One finished micro-batch, as reported to ``on_batch``."""

    batch_id: int
    input_rows: int
    watermark: str | None
    state_rows: int | None


@dataclass(frozen=True)
class DemoResult:
    """What a demo run produced. Counts of sessions come from the Parquet output itself."""

    out_dir: str
    sessions_dir: str
    input_dir: str
    checkpoint_dir: str
    input_events: int
    input_users: int
    input_files: int
    batches: int
    sessions_written: int
    closed_by: dict[str, int]
    users_with_sessions: int
    events_in_sessions: int
    open_sessions: int
    final_watermark: str | None
    reference_sessions: int
    matches_reference: bool
    seconds: float
    gap: str
    watermark_delay: str
    seed: int
    mismatches: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON-ready values.

        >>> DemoResult("o", "o/s", "o/i", "o/c", 1, 1, 1, 1, 1, {"timeout": 1}, 1, 1, 0, None, 1,
        ...            True, 0.5, "1 minute", "10 seconds", 0).to_dict()["sessions_written"]
        1
        """
        return asdict(self)


def prepare_out_dir(out: str | Path) -> Path:
    """Create ``out`` for a demo run, clearing what an earlier demo run left in it.

    A directory that exists, is not empty and was not made by the demo is refused (nothing of
    the user's is ever deleted).

    >>> import tempfile
    >>> d = prepare_out_dir(Path(tempfile.mkdtemp()) / "demo")
    >>> (d / MARKER).exists()
    True
    """
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"demo: the output path {path} is a file; pass --out with a directory")
    if path.is_dir() and any(path.iterdir()) and not (path / MARKER).exists():
        raise ConfigError(
            f"demo: {path} exists, is not empty and was not made by `sparkstate demo`;"
            " pass --out with a new or empty directory"
        )
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text("made by `sparkstate demo`; it clears input/, sessions/ and checkpoint/ here\n")
    for sub in SUBDIRS:
        shutil.rmtree(path / sub, ignore_errors=True)
    return path


def _open_sessions(spark: Any, checkpoint: Path) -> int:
    """Sessions left open in the checkpoint's state: ``sizes`` has one entry per open session of a key (a
    state of an earlier sparkstate, without it, holds one); the store's row count is not keys for every engine."""
    from pyspark.sql import functions as F

    from .state.read import read

    state = read(spark, checkpoint)
    if state.isEmpty():
        return 0
    n = state.select(F.sum(F.when(F.size("sizes") > 0, F.size("sizes")).when(F.size("events") > 0, 1).otherwise(0)))
    row = n.first()
    return int(row[0] or 0) if row is not None else 0


def _parse_watermark(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)


#: The demo job's trigger: a short interval, as the demo's input is all there at the start.
TRIGGER = "50 milliseconds"


def _kafka_source(spark: "SparkSession", kafka: Any, input_dir: Path, seed: int) -> str:
    """The input files' lines, in order, produced to a new one-partition topic; its ``kafka:`` spec."""
    import uuid

    from .io.connectors import require_kafka_connector

    require_kafka_connector(spark, "demo --kafka")
    topic = f"sparkstate-demo-{seed}-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    lines = [line for f in sorted(input_dir.glob("*.json")) for line in f.read_text().splitlines() if line]
    kafka.produce(topic, lines)
    return f"kafka:{kafka.bootstrap}/{topic}"


def _job(spark: "SparkSession", root: Path, seed: int, gap: Duration, watermark: Duration, kafka: Any,
         per_batch: int) -> JobConfig:
    """The demo as a ``sessionize`` job: one file (or a file's worth of offsets) per micro-batch."""
    input_dir, sessions_dir, checkpoint_dir = (root / s for s in SUBDIRS)
    source, options = f"files:{input_dir}", {}
    if kafka is not None:
        source, options = _kafka_source(spark, kafka, input_dir, seed), {"startingOffsets": "earliest"}
    return JobConfig("sessionize", source=source, format="json", sink=f"parquet:{sessions_dir}",
                     checkpoint=str(checkpoint_dir), gap=gap, time_mode="event", watermark=watermark,  # type: ignore[arg-type]
                     trigger=TRIGGER, once=True, query_name=f"sparkstate-demo-{seed}", options=options,
                     max_batch_files=1, max_batch_records=per_batch)


def _reporting(on_batch: Callable[[BatchInfo], None]) -> Callable[["BatchMetrics", "RunTotals"], None]:
    def report(m: "BatchMetrics", totals: "RunTotals") -> None:
        on_batch(BatchInfo(batch_id=m.batch_id, input_rows=m.rows_in, watermark=m.watermark, state_rows=m.state_rows))

    return report


def run_demo(
    spark: "SparkSession",
    out: str | Path = "sparkstate-demo",
    *,
    events: int = 3000,
    users: int = 60,
    seed: int = 0,
    files: int = 10,
    gap: Duration = "1 minute",
    watermark: Duration = "10 seconds",
    on_batch: Callable[[BatchInfo], None] | None = None,
    kafka: Any = None,
) -> DemoResult:
    """Run the demo job into ``out`` and return what it produced (nothing is printed).

    ``on_batch`` is called (on a listener thread) after every micro-batch. ``kafka``: a running
    broker (:class:`~sparkstate.io.kafka_broker.LocalKafka`) to read the events through instead
    of the files; Spark's Kafka connector must be on ``spark``'s classpath.

    >>> import tempfile, sparkstate as ss
    >>> r = run_demo(ss.spark_session(), tempfile.mkdtemp(), events=60, users=3, files=2)
    >>> r.input_events, r.matches_reference
    (60, True)
    """
    if events < 1 or users < 1 or files < 1:
        raise ConfigError(f"demo: events, users and files must be >= 1, got {events}, {users}, {files}")
    started = time.monotonic()
    root = prepare_out_dir(out)
    generated = generate_events(events, users, seed, gap=gap)
    write_events(generated, root / "input", files=files)
    config = _job(spark, root, seed, gap, watermark, kafka, per_batch=-(-len(generated) // files))
    job = run_pipeline(spark, config, on_batch=None if on_batch is None else _reporting(on_batch))
    if job.stopped_by == "interrupted":  # Ctrl-C: the running micro-batch committed, the query stopped
        raise KeyboardInterrupt
    return _result(spark, root, generated, job, files=files, gap=gap, watermark=watermark, seed=seed,
                   seconds=time.monotonic() - started)


def _result(spark: "SparkSession", root: Path, generated: list, job: JobResult, *, files: int, gap: Duration,
            watermark: Duration, seed: int, seconds: float) -> DemoResult:
    """What the run wrote (the Parquet output, the state left), compared with the reference sessions."""
    input_dir, sessions_dir, checkpoint_dir = (root / s for s in SUBDIRS)
    written = [Session.from_row(r) for r in spark.read.parquet(str(sessions_dir)).collect()]
    written.sort(key=lambda s: (s.user_id, s.session_start))
    expected = reference_sessions(generated, gap, watermark=_parse_watermark(job.final_watermark) or 0)
    mismatches = [f"written, not in the reference: {s}" for s in set(written) - set(expected)]
    mismatches += [f"in the reference, not written: {s}" for s in set(expected) - set(written)]
    return DemoResult(
        out_dir=str(root.resolve()),
        sessions_dir=str(sessions_dir.resolve()),
        input_dir=str(input_dir.resolve()),
        checkpoint_dir=str(checkpoint_dir.resolve()),
        input_events=len(generated),
        input_users=len({e.user_id for e in generated}),
        input_files=files,
        batches=job.batches,
        sessions_written=len(written),
        closed_by=dict(sorted(Counter(s.closed_by for s in written).items())),
        users_with_sessions=len({s.user_id for s in written}),
        events_in_sessions=sum(s.event_count for s in written),
        open_sessions=_open_sessions(spark, checkpoint_dir),
        final_watermark=job.final_watermark,
        reference_sessions=len(expected),
        matches_reference=written == expected,
        seconds=round(seconds, 1),
        gap=str(gap),
        watermark_delay=str(watermark),
        seed=seed,
        mismatches=sorted(mismatches)[:20],
    )
