"""A SparkSession with what keyed state needs, and a check of sessions built elsewhere.

>>> import sparkstate as ss
>>> spark = ss.spark_session()
>>> spark.conf.get("spark.sql.streaming.stateStore.providerClass").rsplit(".", 1)[-1]
'RocksDBStateStoreProvider'

The state encoding (``spark.sql.streaming.stateStore.encodingFormat``) is left at Spark's
default, ``unsaferow``, which every stateful operator of Spark takes: sparkstate's operators
lay out and version their state themselves, so its evolution works under either encoding.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from typing import TYPE_CHECKING, Mapping

from .versions import PYTHON_UNIX_SOCKETS, has

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

log = logging.getLogger("sparkstate")

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

#: The settings keyed state relies on, with the reason (shown when one is missing).
REQUIRED_SETTINGS: dict[str, tuple[str, str]] = {
    "spark.sql.streaming.stateStore.providerClass": (
        ROCKSDB_PROVIDER, "transformWithState keeps state only in the RocksDB state store"),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": (
        "true", "checkpoints then write only the changed keys, not a full snapshot"),
}


#: RocksDB's memory, bounded: the settings :func:`default_config` adds, with the reason. Without
#: them every state store instance (one per stateful operator and partition) opens its own
#: 8 MB block cache and memtables of up to 2 x 64 MB, so the native memory of an executor grows
#: with the partitions it hosts and is bounded by nothing you set. And RocksDB's LRU block cache
#: is filled, never emptied: every snapshot (a memtable flush, every
#: ``spark.sql.streaming.stateStore.minDeltasForSnapshot`` = 10 batches) and every compaction
#: writes new files whose blocks are read into the cache, and the blocks of the files they
#: replace stay there until the cache is full. So a job's RocksDB memory rises, however flat its
#: state, until it reaches the cache's size (docs/reliability.md measures it); these settings
#: make that size one budget per executor JVM, which is where the memory levels off.
ROCKSDB_MEMORY: dict[str, tuple[str, str]] = {
    "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage": (
        "true", "one memory budget per executor for the block caches, memtables, index and filter blocks"
                " of all its state stores, instead of 8 MB of cache and up to 128 MB of memtables each"),
    "spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB": (
        "64", "the budget (Spark's default is 500 MB): the block cache fills up to it and stays; half of it"
              " (writeBufferCacheRatio 0.5) caps the memtables, which are flushed early when they reach it"),
}

#: In local mode nothing outside the machine talks to Spark: its driver and block manager
#: ports listen on the loopback interface only (Spark's default is the host's address).
LOCAL_ONLY = {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}


#: Defaults for local mode only: on a cluster its own (or Spark's) values stand. The shuffle
#: partitions become a new checkpoint's state partitions, for good: on a cluster they are the
#: cluster's choice, here the machine's cores.
LOCAL_DEFAULTS = ("spark.sql.shuffle.partitions", "spark.ui.enabled", "spark.ui.showConsoleProgress")


def default_config() -> dict[str, str]:
    """The configuration :func:`spark_session` fills in where nobody set it (before the caller's
    ``config``); the :data:`LOCAL_DEFAULTS` only in local mode."""
    cores = os.cpu_count() or 2
    cfg = {k: v for k, (v, _) in REQUIRED_SETTINGS.items()}
    cfg.update({k: v for k, (v, _) in ROCKSDB_MEMORY.items()})
    cfg.update({
        "spark.sql.shuffle.partitions": str(cores),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "false",
        "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "true",
        # SST data blocks of 16 KB (Spark's 4): index blocks a quarter the size, which stay in the
        # 64 MB budget with millions of keys in state instead of being read again for every lookup
        # (10M keys in state, 10K touched: 6.3-6.5 s a batch with 4 KB, 3.5 s with 16 KB; the
        # record: docs/bench/2026-11-26-large-state.md). Files written before keep their size.
        "spark.sql.streaming.stateStore.rocksdb.blockSizeKB": "16",
        # Whole-stage code generation only where HotSpot compiles the method it generates: HotSpot
        # leaves a method of more than 8,000 bytes of bytecode to its interpreter, and Spark keeps
        # such methods up to 65,535 bytes. Over the limit Spark runs the stage's operators each in
        # smaller compiled methods. The JSON parse with reasons typed a 20-field schema 2.6
        # times as fast on 4.3, sessionize's 4 fields 1.0-1.2 times (benchmarks/parse_rate.py;
        # docs/bench/2026-11-29-parse-one-case.md).
        "spark.sql.codegen.hugeMethodLimit": "8000",
        "spark.python.worker.faulthandler.enabled": "true",
        "spark.sql.execution.pyspark.udf.faulthandler.enabled": "true",
    })
    if os.name == "posix" and has(PYTHON_UNIX_SOCKETS):
        # Python workers and the JVM talk over Unix domain sockets instead of loopback TCP, where a
        # small message waits out the peer's delayed acknowledgement: a Python stage's task went from
        # 59 to 23 ms in a one-record batch, a transformWithStateInPandas task from 158 to 126
        # (docs/performance.md, Settings for low latency).
        cfg["spark.python.unix.domain.socket.enabled"] = "true"
    return cfg


#: Settings only the process that runs Spark's driver can give: a Spark Connect client leaves them
#: to the server (setting them from a client is refused or ignored, with a warning).
SERVER_ONLY = ("spark.ui.", "spark.python.worker.", "spark.python.unix.", "spark.driver.", "spark.master")


def is_connect(spark: object) -> bool:
    """Whether ``spark`` is a Spark Connect session (no JVM in this process).

    >>> import sparkstate as ss
    >>> is_connect(ss.spark_session())
    False
    """
    return type(spark).__module__.startswith("pyspark.sql.connect")


def remote_url(remote: str | None = None) -> str | None:
    """The Spark Connect URL to use: ``remote``, else ``SPARK_REMOTE``, else none (a local JVM).

    >>> remote_url("sc://127.0.0.1:15002")
    'sc://127.0.0.1:15002'
    """
    url = remote or os.environ.get("SPARK_REMOTE") or None
    if url is not None and not url.startswith("sc://") and url != "local" and not url.startswith("local["):
        from .errors import ConfigError

        raise ConfigError(f"Spark Connect: expected a URL like sc://HOST:PORT, got {url!r}")
    return url


def _point_workers_at_this_python() -> None:
    # Workers start `python3` from PATH unless told otherwise, which may lack pandas/pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def spark_session(
    app_name: str = "sparkstate",
    master: str | None = None,
    config: Mapping[str, str] | None = None,
    remote: str | None = None,
) -> "SparkSession":
    """Return (or reuse) a SparkSession set up for keyed state.

    RocksDB state store with changelog checkpointing, RocksDB's memory bounded
    (:data:`ROCKSDB_MEMORY`: 64 MB per executor), UTC session time zone, quiet logs; in local
    mode also shuffle partitions = the machine's cores and no UI (:data:`LOCAL_DEFAULTS`), and
    (PySpark 4.1+) Python workers on Unix domain sockets when it starts the JVM. Each
    only where nobody set it: what spark-submit ``--conf``, ``spark-defaults.conf`` or the
    cluster configured stands. A session that is already running is reused as it is, with one
    warning naming the settings that differ and why they matter. The state encoding stays Spark's default, so one query
    (and one session) may mix sparkstate operators with Spark's streaming aggregations,
    deduplication and joins, which refuse the Avro encoding. ``master=None`` means
    ``local[*]`` unless one is already configured (spark-submit). In local mode Spark's ports
    listen on 127.0.0.1 only (:data:`LOCAL_ONLY`). ``config`` wins over all.

    ``remote="sc://HOST:PORT"`` (or the ``SPARK_REMOTE`` variable) returns a Spark Connect
    session instead: it sets on it the settings a client may set (the SQL ones above), leaves
    the rest to the server, and checks the settings keyed state needs; one the server refuses
    raises :class:`~sparkstate.errors.ConfigError` naming the ``--conf`` to start the server with.
    """
    url = remote_url(remote)
    if url is not None and master is None:
        return _connect_session(url, app_name, config)
    _point_workers_at_this_python()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    builder = SparkSession.builder.appName(app_name)
    chosen = master
    if master is not None:
        builder = builder.master(master)
    elif active is None and not any(m in os.environ.get("PYSPARK_SUBMIT_ARGS", "") for m in ("spark.master", "--master")) \
            and not os.environ.get("SPARK_MASTER") and not os.environ.get("PYSPARK_GATEWAY_PORT"):
        # (PYSPARK_GATEWAY_PORT: started by spark-submit, whose --master is already in the JVM's conf)
        chosen = os.environ.get("SPARKSTATE_MASTER", "local[*]")
        builder = builder.config("spark.master", chosen)
    defaults = default_config()
    given = dict(config or {})
    # Settings of the JVM itself go in before it starts, and only when sparkstate picks a local
    # master (under spark-submit or on a cluster, its own values stand); the caller's go in always.
    startup = {k: v for k, v in defaults.items() if not k.startswith("spark.sql.")} \
        if chosen is not None and chosen.startswith("local") else {}
    if startup:
        startup.update(LOCAL_ONLY)
    startup.update(given)
    for k, v in startup.items():
        builder = builder.config(k, v)
    if _starts_a_jvm(active):
        from .jvm_archive import launching_with_archive

        with launching_with_archive(startup.get("spark.driver.extraJavaOptions")):
            spark = builder.getOrCreate()
    else:
        spark = builder.getOrCreate()
    if active is None:
        _fill_sql_defaults(spark, defaults, given)
        spark.sparkContext.setLogLevel(os.environ.get("SPARKSTATE_SPARK_LOG_LEVEL", "ERROR"))
    else:
        _warn_about_differences(spark, defaults, given)
    for k, v in given.items():  # the caller's settings win over all, on a reused session too
        if k.startswith("spark.sql.") and spark.conf.get(k, None) != v:
            try:
                spark.conf.set(k, v)
            except Exception:  # static settings of an existing session cannot change
                log.debug("could not set %s on the existing session", k)
    return spark


def _starts_a_jvm(active: object) -> bool:
    """Whether ``getOrCreate`` will launch the driver's JVM here (not under spark-submit, none running)."""
    from pyspark import SparkContext

    return active is None and SparkContext._gateway is None and not os.environ.get("PYSPARK_GATEWAY_PORT")


def _fill_sql_defaults(spark: "SparkSession", defaults: Mapping[str, str], given: Mapping[str, str]) -> None:
    """Set each SQL default on a session sparkstate just started, unless it was configured where
    Spark was launched (spark-submit ``--conf``, ``spark-defaults.conf``, the builder) or the
    caller gives it; the :data:`LOCAL_DEFAULTS` only in local mode."""
    launched = spark.sparkContext.getConf()
    local = (spark.sparkContext.master or "").startswith("local")
    for k, v in defaults.items():
        if not k.startswith("spark.sql.") or k in given or launched.contains(k):
            continue
        if k in LOCAL_DEFAULTS and not local:
            continue
        spark.conf.set(k, v)


_warned: set[tuple[int, tuple[str, ...]]] = set()


def _warn_about_differences(spark: "SparkSession", defaults: Mapping[str, str], given: Mapping[str, str]) -> None:
    """An existing session is left as it is: warn (once for the same differences) about the
    settings keyed state relies on that it has otherwise, with the reason each matters."""
    reasons = {**{k: why for k, (_, why) in REQUIRED_SETTINGS.items()},
               **{k: why for k, (_, why) in ROCKSDB_MEMORY.items()}}
    differ = []
    for k, why in reasons.items():
        have, want = spark.conf.get(k, None), defaults[k]
        if k not in given and (have is None or have.lower() != want.lower()):
            differ.append(f"{k}={have} (sparkstate's default {want}: {why})")
    if differ and (id(spark), tuple(differ)) not in _warned:
        _warned.add((id(spark), tuple(differ)))
        warnings.warn("sparkstate: spark_session() reuses the running session as it is, which has "
                      + "; ".join(differ) + ". Pass them in config= to change them, or stop the session first.",
                      stacklevel=3)


def _connect_session(url: str, app_name: str, config: Mapping[str, str] | None) -> "SparkSession":
    """A Spark Connect session with every client-settable setting of :func:`default_config`."""
    from pyspark.sql import SparkSession

    from .errors import ConfigError

    spark = SparkSession.builder.remote(url).appName(app_name).getOrCreate()
    settings = default_config()
    settings.update(config or {})
    required = {k: v for k, (v, _) in REQUIRED_SETTINGS.items()}
    for key, value in settings.items():
        if key.startswith(SERVER_ONLY) or not key.startswith("spark.sql."):
            continue
        try:
            if spark.conf.get(key, None) != value:
                spark.conf.set(key, value)
        except Exception as exc:  # the server refuses this setting from a client
            if key in required:
                raise ConfigError(f"the Spark Connect server at {url} refuses {key} from a client"
                                  f" ({_first_line(exc)}); start the server with --conf {key}={value}"
                                  f" ({REQUIRED_SETTINGS[key][1]})") from None
            log.info("Spark Connect: could not set %s on the session: %s", key, _first_line(exc))
    check_connect_settings(spark, url)
    return spark


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def check_connect_settings(spark: "SparkSession", url: str = "the server") -> None:
    """Raise :class:`~sparkstate.errors.ConfigError` unless a Connect session has the settings
    keyed state needs (:data:`REQUIRED_SETTINGS`), naming the ``--conf`` the server needs."""
    from .errors import ConfigError

    for key, (want, why) in REQUIRED_SETTINGS.items():
        have = spark.conf.get(key, None)
        if have is None or have.lower() != want.lower():
            raise ConfigError(f"the Spark Connect server at {url} runs with {key}={have}; keyed state needs"
                              f" {want} ({why}): start the server with --conf {key}={want}")


_checked: set[int] = set()


def check_session(spark: "SparkSession") -> None:
    """Warn once per session about missing settings; set the state store provider if absent.

    transformWithState cannot run without RocksDB, so the provider is set (with a warning);
    the others are recommendations.
    """
    ident = id(spark)
    if ident in _checked:
        return
    _checked.add(ident)
    for key, (want, why) in REQUIRED_SETTINGS.items():
        have = spark.conf.get(key, None)
        if have is not None and have.lower() == want.lower():
            continue
        if key.endswith("providerClass"):
            spark.conf.set(key, want)
            warnings.warn(f"sparkstate: set {key}={want} on this session ({why}); it was {have!r}."
                          " Use ss.spark_session() to start with every setting keyed state needs.", stacklevel=4)
        else:
            warnings.warn(f"sparkstate: {key} is {have!r}, recommended {want!r}: {why}."
                          " Use ss.spark_session(), or set it before the query starts.", stacklevel=4)


#: How Spark reports a Python process it started that did not connect back to it within its
#: fixed 10 s (not a setting: ``PythonWorkerFactory``). Over Spark Connect the server starts one
#: such process for every ``foreachBatch`` query, when the query starts and outside Spark's task
#: retries, so a server busy for a few seconds fails the start of a query that would run fine.
WORKER_NOT_BACK = "Python worker failed to connect back"

#: Attempts at starting a query whose Python process did not connect back (each waits 10 s).
START_ATTEMPTS = 3

#: Seconds to wait before the second attempt (twice that before the third): a machine too busy
#: to start a Python process in 10 s is often busy for a while (another query's batch).
START_PAUSE_S = 5.0


def pause_before_attempt(attempt: int) -> None:
    """Wait before attempt ``attempt + 1`` at starting a query whose Python process did not connect back."""
    time.sleep(START_PAUSE_S * attempt)


def start_query(writer: "DataStreamWriter", what: str = "the query") -> "StreamingQuery":
    """``writer.start()``; started again (up to :data:`START_ATTEMPTS` times in all) when Spark's
    Python process for it did not connect back in time, with a warning each time.

    A start that fails that way has run nothing and written nothing, so starting again is the
    same query on the same checkpoint. Any other error is raised as it is; the last such failure
    raises :class:`~sparkstate.errors.JobFailedError` in one line.
    """
    from .errors import JobFailedError

    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            return writer.start()
        except Exception as exc:
            if WORKER_NOT_BACK not in str(exc):
                raise
            if attempt == START_ATTEMPTS:
                raise JobFailedError(
                    f"{what} did not start: {START_ATTEMPTS} times Spark's Python process for it did not"
                    " connect back within Spark's fixed 10 s; the machine running Spark (or its Connect"
                    " server) is too busy, or its Python cannot start (spark.pyspark.python,"
                    " PYSPARK_PYTHON)") from None
            log.warning("%s: Spark's Python process for it did not connect back within Spark's fixed 10 s"
                        " (a busy machine); starting it again (attempt %d of %d)", what, attempt + 1,
                        START_ATTEMPTS)
            pause_before_attempt(attempt)
    raise AssertionError("unreachable")
