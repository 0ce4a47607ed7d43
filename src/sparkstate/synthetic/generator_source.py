"""The generator as a Spark streaming source: a PySpark Python data source of raw JSON lines.

Offsets count records. Each micro-batch reads records ``[start, end)``; a partition computes
its slice from the configuration alone (:func:`~sparkstate.synthetic.stream.stream_records`), so the
same seed gives the same records whatever the batch boundaries, and a restarted query
continues where its checkpoint ends. Rows are ``value string`` (the raw line, malformed or
not) and ``offset long`` (the record's index); :func:`sparkstate.io.sources.open_source`
parses them like any other JSON-lines source.

Pacing: with ``rate > 0`` the source offers ``burst`` records (default 0) when the query starts,
then ``rate`` records per second of wall-clock time since it started (``maxEventsPerTrigger``
caps a batch, so a burst is read in bounded batches); with ``rate=0`` everything up to
``events`` at once. Under ``trigger(availableNow=True)`` the stream ends at ``events`` (for an
endless stream: after one second's worth of records, ``rate`` of them), without pacing.

>>> import sparkstate as ss
>>> spark = ss.spark_session()
>>> name = register(spark)
>>> rows = spark.read.format(name).options(events="5", users="2", seed="1", rate="0").load().collect()
>>> [r.offset for r in rows]
[0, 1, 2, 3, 4]
"""

from __future__ import annotations

import math
import time
import weakref
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from ..errors import ConfigError
from .stream import StreamConfig, stream_records

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The name the source is registered under (``spark.readStream.format(NAME)``).
NAME = "sparkstate_generator"
#: Rows of the source.
RAW_SCHEMA = "value string, offset bigint"
#: Options of the source itself (the others are :class:`~sparkstate.synthetic.stream.StreamConfig`'s).
SOURCE_OPTIONS = ("maxEventsPerTrigger", "partitions")


class _Slice(InputPartition):
    def __init__(self, start: int, stop: int) -> None:
        super().__init__((start, stop))
        self.start = start
        self.stop = stop


def _split(options: dict[str, str]) -> tuple[StreamConfig, dict[str, str]]:
    # Spark lower-cases option names; our own are matched case-insensitively.
    own_names = {name.lower(): name for name in SOURCE_OPTIONS}
    own = {own_names[k.lower()]: v for k, v in options.items() if k.lower() in own_names}
    rest = {k: v for k, v in options.items() if k.lower() not in own_names and k.lower() != "path"}
    return StreamConfig.from_options(rest), own


def _slices(start: int, stop: int, parts: int) -> list[_Slice]:
    n = stop - start
    if n <= 0:
        return []
    parts = max(1, min(parts, n))
    step = math.ceil(n / parts)
    return [_Slice(a, min(a + step, stop)) for a in range(start, stop, step)]


def _rows(config: StreamConfig, part: _Slice) -> Iterator[tuple[str, int]]:
    for rec in stream_records(config, part.start, part.stop):
        yield (rec.line, rec.index)


class GeneratorDataSource(DataSource):
    """The synthetic clickstream; options are :class:`~sparkstate.synthetic.stream.StreamConfig`'s
    (``users``, ``seed``, ``rate``, ``events``, ``late``, ``malformed``, ...) plus
    ``maxEventsPerTrigger`` and ``partitions`` (slices per micro-batch, default 2)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return RAW_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return _BatchReader(self.options)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _StreamReader(self.options)


class _BatchReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.config, own = _split(dict(options))
        if self.config.events is None:
            raise ConfigError("generator: a batch read needs a total; pass the option events=N")
        self.parts = int(own.get("partitions", 2))

    def partitions(self) -> Sequence[InputPartition]:
        return _slices(0, self.config.events or 0, self.parts) or [_Slice(0, 0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[str, int]]:
        return _rows(self.config, partition)  # type: ignore[arg-type]


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.config, own = _split(dict(options))
        self.parts = int(own.get("partitions", 2))
        self.max_per_trigger = int(own["maxEventsPerTrigger"]) if "maxEventsPerTrigger" in own else None
        if self.max_per_trigger is not None and self.max_per_trigger < 1:
            raise ConfigError(f"generator: maxEventsPerTrigger must be >= 1, got {self.max_per_trigger}")
        self._clock_start: float | None = None
        self._base = 0
        self._target: int | None = None
        self._available_now = False

    def initialOffset(self) -> dict:
        return {"index": 0}

    def _available(self, start: int) -> int:
        now = time.monotonic()
        if self._clock_start is None:  # the first call of this run: pace from here
            self._clock_start, self._base = now, start
        if self.config.rate == 0:
            avail = self.config.events if self.config.events is not None else start
        else:
            avail = self._base + self.config.burst + int(self.config.rate * (now - self._clock_start))
        if self.config.events is not None:
            avail = min(avail, self.config.events)
        if self._available_now:
            if self._target is None:  # endless: one second's worth of records, then the end
                self._target = start + max(1, int(self.config.rate))
            avail = self._target if self.config.events is None else self.config.events
        return max(avail, start)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True  # no pacing: everything up to the target at once

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = int(start["index"])
        end = self._available(begin)
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        return {"index": end}

    def reportLatestOffset(self) -> dict | None:
        """What the source has offered so far, whatever a batch's limit took (the backlog in the metrics)."""
        if self._clock_start is None:
            return None
        return {"index": self._available(self._base)}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return _slices(int(start["index"]), int(end["index"]), self.parts)

    def read(self, partition: InputPartition) -> Iterator[tuple[str, int]]:
        return _rows(self.config, partition)  # type: ignore[arg-type]

    def commit(self, end: dict) -> None:
        pass


#: The sessions the source is registered with (weakly: a stopped, dropped session leaves it).
_REGISTERED: "weakref.WeakSet[SparkSession]" = weakref.WeakSet()


def register(spark: "SparkSession") -> str:
    """Register the generator source with ``spark`` (once per session) and return its name.

    >>> import sparkstate as ss
    >>> register(ss.spark_session())
    'sparkstate_generator'
    """
    if spark not in _REGISTERED:
        spark.dataSource.register(GeneratorDataSource)
        _REGISTERED.add(spark)
    return NAME


__all__ = ["GeneratorDataSource", "NAME", "RAW_SCHEMA", "SOURCE_OPTIONS", "register"]
