"""Latency: how soon a result comes out. Kafka in -> the stateful job -> Kafka out, per contender.

``python -m benchmarks.latency`` starts a local Kafka broker (the one the tests use), then runs
each contender in a process and a JVM of its own, on topics of its own, through the same phases:

1. **warm-up**: one event for every key (``--keys``, 50K), so the state holds them all;
2. **floor**: ``--floor`` single records, each sent once the previous one's result is out: the
   latency of a micro-batch carrying one record into a warm job;
3. **rates**: events at a fixed rate (``--rates``, 1K and 10K events/s) for ``--seconds`` each;
4. **backlog**: ``--backlog`` events at once: the rate the job works them off is the highest
   rate it sustains.

Between phases, one probe record per input partition is sent and the phase ends when every
probe's result is out (Spark reads each partition in offset order, so everything before a probe
has been processed). Topics stamp records with the broker's clock (``LogAppendTime``), so an
output record's latency is its append time minus the append time of the newest input it
reflects: for the running count, a key's row ``(key, n)`` reflects the key's n-th event; for
sessions (closed by an ``is_last`` event, emitted at once: ``emit_on_last``), the session's
last event. Nothing is taken from the job's own clock. The sessions' gap
(:data:`.latency_job.SESSION_GAP_MS`) outlasts a run: no session of the warm-up is closed by its
gap while latency is measured.

Contenders: Java ``mapGroupsWithState`` / ``flatMapGroupsWithState`` (the reference), raw
PySpark ``transformWithState``, sparkstate's batched engine (``map_groups_with_state``, and
``sessionize``; ``sparkstate-nopack``: the count with ``BatchedEngine(pack=False)``),
``map_batches_with_state`` (count), and ``sparkstate run``'s own job (the CLI command, with its
default trigger unless ``--run-trigger`` says otherwise).

**Variants** measure settings side by side in the same run: ``CONTENDER+SETTING=VALUE[+...]``
is the contender with the settings of :data:`SETTINGS` changed (``sparkstate-batched+partitions=1``,
``java-mgws+trigger=100ms+changelog=off``); ``--variants`` adds them to the run, ``--contenders``
takes them too, and ``--run-triggers`` adds ``sparkstate-run+trigger=T`` per trigger. A JSON copy
of every figure goes to ``benchmarks/results/latency-*.json``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from sparkstate.durations import positive_ms
from sparkstate.io.sources import KAFKA_CONSUMER_DEFAULTS
from sparkstate.versions import pyspark_minor

from .latency_job import SESSION_GAP_MS, SESSION_WATERMARK_MS, JobTask

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PARTITIONS = 2
#: Contenders of each workload; ``sparkstate-run`` is ``sparkstate run``'s own job (the CLI).
CONTENDERS = {
    "count": ("java-mgws", "sparkstate-batched", "sparkstate-nopack", "sparkstate-inband", "sparkstate-vectorized",
              "sparkstate-run", "pyspark-tws", "pyspark-pandas"),
    "sessions": ("java-fmgws", "sparkstate-batched", "sparkstate-run", "pyspark-tws", "pyspark-pandas"),
}
REFERENCE = {"count": "java-mgws", "sessions": "java-fmgws"}
#: The PySpark minors a contender runs on, where not every supported one: raw PySpark's
#: transformWithState in Python rows (4.1), the batched engine forced (4.0). A run without
#: --contenders measures what the installed minor runs; raw applyInPandasWithState stands for raw
#: PySpark where transformWithState is missing.
RUNS_FROM = {"pyspark-tws": (4, 1), "sparkstate-batched": (4, 0), "sparkstate-nopack": (4, 0),
             "sparkstate-vectorized": (4, 0)}
RUNS_BEFORE = {"pyspark-pandas": (4, 1)}


def runs_here(contender: str, workload: str, minor: tuple[int, int], default: bool = False) -> bool:
    """Whether ``contender`` runs on PySpark ``minor`` (sessions' ``sparkstate-batched`` is
    sessionize on the minor's default engine: every minor); with ``default``, whether a run
    without --contenders measures it there. A run leaves out the others, saying so for one named
    in full."""
    if workload == "sessions" and contender == "sparkstate-batched":
        return True
    if minor < RUNS_FROM.get(contender, (0, 0)):
        return False
    return not default or minor < RUNS_BEFORE.get(contender, (99, 0))


def _count(text: str) -> str:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"expected a whole number of at least 1, got {text!r}")
    return str(int(text))


def _switch(text: str) -> str:
    value = {"on": "true", "true": "true", "off": "false", "false": "false"}.get(text.lower())
    if value is None:
        raise ValueError(f"expected on or off, got {text!r}")
    return value


def _trigger(text: str) -> str:
    return f"{positive_ms(text, 'trigger')} milliseconds"


def _checkpoints(text: str) -> str:
    """``filesystem`` or ``filecontext``: Spark's checkpoint file manager on Hadoop's FileSystem
    or FileContext API (Spark's default), by its class name in the installed PySpark."""
    kind = {"filesystem": "FileSystem", "filecontext": "FileContext"}.get(text.lower())
    if kind is None:
        raise ValueError(f"expected filesystem or filecontext, got {text!r}")
    package = "checkpointing." if pyspark_minor() >= (4, 1) else ""  # the class moved in 4.1
    return f"org.apache.spark.sql.execution.streaming.{package}{kind}BasedCheckpointFileManager"


@dataclass(frozen=True)
class Setting:
    """What a variant's ``NAME=VALUE`` changes: a Spark setting (``conf``), an option of the Kafka
    source (``option``), a flag of ``sparkstate run`` (``run_flag``, whose ``--no-`` form an off
    value gives; ``sparkstate-run`` only) or, with none, the query's processing-time trigger.
    ``parse`` checks a value and gives the one passed on."""

    conf: str | None
    parse: Callable[[str], str]
    help: str
    option: str | None = None
    run_flag: str | None = None


#: The settings a variant (``CONTENDER+NAME=VALUE``) may change, by short name.
SETTINGS = {
    "trigger": Setting(None, _trigger, "the query's processing-time trigger, a duration (100ms, 1 second);"
                       " default: a micro-batch as soon as the previous one ends (sparkstate run: its --trigger)"),
    "partitions": Setting("spark.sql.shuffle.partitions", _count,
                          "shuffle partitions, one state store each (the benchmark's default: 2)"),
    "changelog": Setting("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", _switch,
                         "RocksDB changelog checkpointing, on (sparkstate's default) or off (every commit"
                         " uploads RocksDB's files)"),
    "blocksize": Setting("spark.sql.streaming.stateStore.rocksdb.blockSizeKB", _count,
                         "RocksDB's SST block size in KB (sparkstate's default: 16)"),
    "fetchwait": Setting(None, _count, "the Kafka source's kafka.fetch.max.wait.ms (every contender's default:"
                         f" sparkstate's {KAFKA_CONSUMER_DEFAULTS['kafka.fetch.max.wait.ms']}; Kafka's own: 500)",
                         option="kafka.fetch.max.wait.ms"),
    "maxrecords": Setting("spark.sql.execution.arrow.maxRecordsPerBatch", _count,
                          "rows per Arrow batch between the JVM and Python (Spark's default: 10,000)"),
    "unixsockets": Setting("spark.python.unix.domain.socket.enabled", _switch,
                           "Python workers on Unix domain sockets (PySpark 4.1+), on (sparkstate's default) or off"
                           " (loopback TCP, Spark's default)"),
    "checkpoints": Setting("spark.sql.streaming.checkpointFileManagerClass", _checkpoints,
                           "the checkpoint's file manager: filecontext (Spark's default) or filesystem (to measure"
                           " only: on a local disk it does not replace a file that exists)"),
    "pack": Setting(None, _switch, "sparkstate run's packing step (--pack, its default, or --no-pack)",
                    run_flag="pack"),
}


@dataclass(frozen=True)
class Variant:
    """A contender to run: ``base`` (a name of :data:`CONTENDERS`) with ``settings`` changed
    (short names of :data:`SETTINGS` -> checked values); ``name`` is how it was written."""

    name: str
    base: str
    settings: dict = field(default_factory=dict)

    @property
    def conf(self) -> dict[str, str]:
        return {c: v for k, v in self.settings.items() if (c := SETTINGS[k].conf) is not None}

    @property
    def options(self) -> dict[str, str]:
        """The Kafka source options it changes."""
        return {o: v for k, v in self.settings.items() if (o := SETTINGS[k].option) is not None}

    @property
    def trigger(self) -> str | None:
        return self.settings.get("trigger")

    @property
    def run_flags(self) -> list[str]:
        """The ``sparkstate run`` flags it changes (``--no-pack``)."""
        return [f"--{f}" if self.settings[k] == "true" else f"--no-{f}"
                for k in self.settings if (f := SETTINGS[k].run_flag) is not None]


def parse_variant(name: str, workloads: list[str]) -> Variant:
    """``CONTENDER[+SETTING=VALUE...]`` as a :class:`Variant`; ``ValueError`` (one line) if
    the contender is none of ``workloads``' or a setting unknown, repeated or its value wrong."""
    base, *parts = name.split("+")
    known = [c for w in workloads for c in CONTENDERS[w]]
    if base not in known:
        raise ValueError(f"{name}: {base!r} is not a contender of {' or '.join(workloads)}"
                         f" (one of {', '.join(dict.fromkeys(known))})")
    settings: dict[str, str] = {}
    for part in parts:
        key, _, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if key not in SETTINGS:
            raise ValueError(f"{name}: unknown setting {key!r} (one of {', '.join(SETTINGS)})")
        if not value:
            raise ValueError(f"{name}: {key} needs a value: {key}=VALUE")
        if key in settings:
            raise ValueError(f"{name}: {key} is given twice")
        try:
            settings[key] = SETTINGS[key].parse(value)
        except ValueError as exc:
            raise ValueError(f"{name}: {key}: {exc}") from None
        if SETTINGS[key].run_flag is not None and base != "sparkstate-run":
            raise ValueError(f"{name}: {key} is a flag of sparkstate run: sparkstate-run+{key}=VALUE")
    return Variant(name, base, settings)


#: The variants of docs/performance.md's settings table, which a run measures when it is given
#: neither ``--contenders`` nor ``--variants`` (each runs only in the workload of its contender).
DOCUMENTED_VARIANTS = (
    "java-mgws+fetchwait=500", "java-mgws+partitions=1", "sparkstate-batched+fetchwait=500",
    "sparkstate-batched+partitions=1", "sparkstate-batched+changelog=off", "sparkstate-run+trigger=1s",
    "java-fmgws+fetchwait=500", "sparkstate-run+pack=off", "sparkstate-batched+unixsockets=off",
    "sparkstate-run+unixsockets=off", "java-mgws+checkpoints=filesystem", "sparkstate-batched+checkpoints=filesystem",
)


def plan(args: argparse.Namespace, workload: str) -> list[Variant]:
    """The contenders of ``workload`` this run measures, in order: each base contender the
    ``--contenders`` prefixes select (all without them), each variant after its base (without
    ``--contenders`` and ``--variants``: :data:`DOCUMENTED_VARIANTS`; ``--quick``: none)."""
    workloads = ["count", "sessions"] if args.workload == "all" else [args.workload]
    given = args.contenders or []
    prefixes = [c for c in given if "+" not in c]
    variants_given = args.variants
    if variants_given is None:
        variants_given = [] if (given or args.quick) else list(DOCUMENTED_VARIANTS)
    named = [c for c in given if "+" in c] + list(variants_given)
    named += [f"sparkstate-run+trigger={t}" for t in args.run_triggers]
    variants = [parse_variant(n, workloads) for n in dict.fromkeys(named)]
    minor = pyspark_minor()
    if args.variants is None and not given:  # the documented table: of the contenders this minor runs
        variants = [v for v in variants if runs_here(v.base, workload, minor, default=True)]
    out = []
    for base in CONTENDERS[workload]:
        if (any(base.startswith(c) for c in prefixes) or not given) and runs_here(base, workload, minor,
                                                                                   default=not given):
            out.append(Variant(base, base))
        out += [v for v in variants if v.base == base]
    return out


def left_out(args: argparse.Namespace, workload: str) -> list[str]:
    """The contenders of ``workload`` named in full in --contenders that the installed PySpark
    does not run (:func:`runs_here`): :func:`plan` leaves them out, and the run says so first."""
    minor = pyspark_minor()
    return [c for c in CONTENDERS[workload] if c in (args.contenders or []) and not runs_here(c, workload, minor)]


#: The first seconds of a rate phase are not counted: the job catches up with the change of rate.
SETTLE_S = 3.0


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)  # nearest rank
    return ordered[min(len(ordered), max(1, math.ceil(q / 100 * len(ordered)))) - 1]


def summarize(latencies: list[float]) -> dict[str, Any]:
    return {"n": len(latencies), **{f"p{q}": _percentile(latencies, q) for q in (50, 95, 99)},
            "max": max(latencies) if latencies else None}


class Workload:
    """What the producer writes and how an output record names the input it reflects (its marker)."""

    def __init__(self, name: str, keys: int, seed: int) -> None:
        self.name = name
        self.keys = [f"u{i:05d}" for i in range(keys)]
        self.rng = random.Random(seed)
        self.counts: dict[str, int] = {}
        self.seq = 0

    def event(self, key: str, last: bool | None = None) -> tuple[bytes, Any]:
        """The value of the next event of ``key`` and the marker its result will carry (None: no result due)."""
        self.seq += 1
        if self.name == "count":
            n = self.counts[key] = self.counts.get(key, 0) + 1
            return json.dumps({"user": key, "word": key, "seq": self.seq, "activity": "a"}).encode(), n
        now = datetime.now(timezone.utc)
        flag = self.rng.random() < 0.1 if last is None else last
        data = f"e{self.seq}"
        value = {"user_id": key, "event_time": now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z",
                 "data": data, "is_last": flag}
        return json.dumps(value).encode(), data if flag else None

    @staticmethod
    def marker_of(workload: str, value: dict) -> Any:
        if workload == "count":
            return int(value["count"])
        events = value.get("events") or []
        return events[-1] if value.get("closed_by") == "last_event" and events else None

    def input_marker(self, value: dict, nth: int) -> Any:
        if self.name == "count":
            return nth
        return value["data"] if value.get("is_last") else None


def partition_of(key: str) -> int:
    return zlib.crc32(key.encode()) % PARTITIONS


def record_of(msg: Any) -> tuple[str, Any]:
    """A Kafka record's key and JSON value; every record of the benchmark's topics has both."""
    key, value = msg.key(), msg.value()
    if key is None or value is None:
        raise ValueError(f"{msg.topic()}[{msg.partition()}] offset {msg.offset()}: a record without key or value")
    return key.decode(), json.loads(value)


class Tracker(threading.Thread):
    """Reads the output topic as it is written: which (key, marker) results are out."""

    def __init__(self, bootstrap: str, topic: str, workload: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer, TopicPartition

        self.workload = workload
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lat-{uuid.uuid4().hex}",
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                  "isolation.level": "read_uncommitted"})
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.seen: set = set()
        self.cond = threading.Condition()
        self.stopped = False
        self.error: str | None = None

    def run(self) -> None:
        while not self.stopped:
            msg = self.consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error():
                self.error = str(msg.error())
                continue
            key, value = record_of(msg)
            marker = Workload.marker_of(self.workload, value)
            if marker is not None:
                with self.cond:
                    self.seen.add((key, marker))
                    self.cond.notify_all()
        self.consumer.close()

    def wait_for(self, items: set, timeout_s: float, alive: Any) -> None:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not items <= self.seen:
                if time.monotonic() > deadline:
                    missing = len(items - self.seen)
                    raise TimeoutError(f"{missing} of {len(items)} results not out after {timeout_s:g} s")
                alive()
                self.cond.wait(0.5)


@dataclass
class Phase:
    name: str
    start_ms: float = 0.0
    end_ms: float = 0.0
    sent: int = 0
    rate: int | None = None


@dataclass
class Outcome:
    contender: str
    workload: str
    phases: dict = field(default_factory=dict)
    error: str | None = None
    progress: list = field(default_factory=list)
    settings: dict = field(default_factory=dict)  # a variant's: short names of SETTINGS -> values


def dead_letter_topic(topic_out: str) -> str:
    """The topic of ``sparkstate run``'s dead letters beside the output topic ``topic_out`` (a job whose
    two sinks are Kafka on one broker writes both in one streaming write)."""
    return f"{topic_out}-deadletters"


def run_command(contender: Variant, workload: str, bootstrap: str, topic_in: str, topic_out: str, work: Path,
                tag: str, default_trigger: str | None, submit_args: str | None) -> tuple[list[str], dict[str, str]]:
    """``sparkstate run``'s command line for ``contender`` and the environment it adds: the
    trigger goes in ``--trigger``, Spark settings in ``PYSPARK_SUBMIT_ARGS`` as spark-submit
    ``--conf``s (the command has no flag for them; ``sparkstate.spark_session`` keeps what
    spark-submit set), before what the variable held."""
    pipeline = ["running-count"] if workload == "count" else [
        "sessionize", "--time-mode", "event", "--emit-on-last", "--gap", f"{SESSION_GAP_MS} milliseconds",
        "--watermark", f"{SESSION_WATERMARK_MS} milliseconds"]
    cmd = [sys.executable, "-m", "sparkstate.cli", "run", *pipeline,
           "--source", f"kafka:{bootstrap}/{topic_in}", "--sink", f"kafka:{bootstrap}/{topic_out}",
           "--deadletter", f"kafka:{bootstrap}/{dead_letter_topic(topic_out)}",
           "--checkpoint", str(work / f"{tag}-checkpoint"), "--option", "startingOffsets=earliest", "--no-progress",
           "--metrics", str(work / f"{tag}-metrics.jsonl")]
    for k, v in contender.options.items():
        cmd += ["--option", f"{k}={v}"]
    cmd += contender.run_flags
    trigger = contender.trigger or default_trigger
    if trigger:
        cmd += ["--trigger", trigger]
    env = {}
    if contender.conf:
        confs = [a for k, v in contender.conf.items() for a in ("--conf", f"{k}={v}")]
        env["PYSPARK_SUBMIT_ARGS"] = " ".join([*map(shlex.quote, confs), submit_args or "pyspark-shell"])
    return cmd, env


class Bench:
    def __init__(self, args: argparse.Namespace, bootstrap: str, jar: str | None, work: Path) -> None:
        self.args = args
        self.bootstrap = bootstrap
        self.jar = jar
        self.work = work

    # -- the contender's process ----------------------------------------------------------------
    def start(self, contender: Variant, workload: str, topic_in: str, topic_out: str,
              tag: str) -> tuple[Any, Any]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
            [str(ROOT), str(ROOT / "src")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]))
        log = open(self.work / f"{tag}.log", "w")
        checkpoint = self.work / f"{tag}-checkpoint"
        if contender.base == "sparkstate-run":
            cmd, extra_env = run_command(contender, workload, self.bootstrap, topic_in, topic_out, self.work, tag,
                                         self.args.run_trigger, env.get("PYSPARK_SUBMIT_ARGS"))
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**env, **extra_env},
                                    cwd=self.work)
            return proc, None
        task = JobTask(contender=contender.base, workload=workload, bootstrap=self.bootstrap, topic_in=topic_in,
                       topic_out=topic_out, checkpoint=str(checkpoint), stop_file=str(self.work / f"{tag}.stop"),
                       progress_file=str(self.work / f"{tag}.progress.json"), jar=self.jar,
                       conf=contender.conf, options=contender.options, trigger=contender.trigger)
        path = self.work / f"{tag}.task.json"
        path.write_text(json.dumps(asdict(task)))
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.latency_job", str(path)], stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        return proc, task

    def stop(self, proc: Any, task: JobTask | None) -> list:
        if task is not None:
            Path(task.stop_file).touch()
        else:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if task is not None and Path(task.progress_file).exists():
            return json.loads(Path(task.progress_file).read_text())
        return []

    # -- one contender ---------------------------------------------------------------------------
    def run_one(self, variant: Variant, workload_name: str) -> Outcome:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        contender = variant.name
        tag = re.sub(r"[^A-Za-z0-9._-]", "_", f"{workload_name}-{contender}-{uuid.uuid4().hex[:6]}")
        topic_in, topic_out = f"{tag}-in", f"{tag}-out"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(t, num_partitions=PARTITIONS, replication_factor=1,
                                                config={"message.timestamp.type": "LogAppendTime"})
                                       for t in (topic_in, topic_out, dead_letter_topic(topic_out))])
        for f in futures.values():
            f.result()
        workload = Workload(workload_name, self.args.keys, self.args.seed)
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 2, "acks": "1"})
        tracker = Tracker(self.bootstrap, topic_out, workload_name)
        tracker.start()
        outcome = Outcome(contender, workload_name, settings=dict(variant.settings))
        proc, task = self.start(variant, workload_name, topic_in, topic_out, tag)
        probes = 0

        def alive() -> None:
            if proc.poll() is not None:
                raise RuntimeError(f"{contender} exited with {proc.returncode}; see {self.work / (tag + '.log')}")

        phase_of: dict = {}  # (key, marker) -> the phase that sent it

        def send(key: str, last: bool | None = None) -> Any:
            value, marker = workload.event(key, last)
            while True:
                try:
                    producer.produce(topic_in, value=value, key=key.encode(), partition=partition_of(key))
                    break
                except BufferError:
                    producer.poll(0.05)
            if marker is None:
                return None
            phase_of[(key, marker)] = next(reversed(outcome.phases))
            return (key, marker)

        def barrier(timeout_s: float) -> None:
            nonlocal probes
            probes += 1
            wanted = set()
            for p in range(PARTITIONS):
                key = next(f"probe{probes}-{i}" for i in range(1000) if partition_of(f"probe{probes}-{i}") == p)
                wanted.add(send(key, last=True))
            producer.flush()
            tracker.wait_for(wanted, timeout_s, alive)

        def phase(name: str, rate: int | None = None) -> Phase:
            ph = Phase(name, rate=rate)
            outcome.phases[name] = ph
            return ph

        try:
            ph = phase("warm-up")
            ph.start_ms = time.time() * 1000
            for key in workload.keys:
                send(key, last=False)
                producer.poll(0)
            ph.sent = len(workload.keys)
            producer.flush()
            ph.end_ms = time.time() * 1000
            barrier(self.args.start_timeout)

            ph = phase("floor")
            ph.start_ms = time.time() * 1000
            for _ in range(self.args.floor):
                item = send(workload.rng.choice(workload.keys), last=True)
                producer.flush()
                tracker.wait_for({item}, 120, alive)
                ph.sent += 1
            ph.end_ms = time.time() * 1000

            for rate in self.args.rates:
                ph = phase(f"{rate}/s", rate)
                ph.start_ms = time.time() * 1000
                t0 = time.monotonic()
                total = int(rate * self.args.seconds)
                while ph.sent < total:
                    due = min(total, int((time.monotonic() - t0) * rate) + 1)
                    while ph.sent < due:
                        send(workload.rng.choice(workload.keys))
                        ph.sent += 1
                    producer.poll(0)
                    time.sleep(min(0.005, max(0.0, t0 + ph.sent / rate - time.monotonic())))
                producer.flush()
                ph.end_ms = time.time() * 1000
                barrier(600)

            if self.args.backlog:
                ph = phase("backlog")
                ph.start_ms = time.time() * 1000
                for _ in range(self.args.backlog):
                    send(workload.rng.choice(workload.keys))
                    producer.poll(0)
                ph.sent = self.args.backlog
                producer.flush()
                ph.end_ms = time.time() * 1000
                barrier(1800)
        except Exception as exc:  # the other contenders still run
            outcome.error = str(exc)
        finally:
            outcome.progress = self.stop(proc, task)
            tracker.stopped = True
            tracker.join(10)
        if outcome.error is None:
            self.measure(outcome, workload, topic_in, topic_out, phase_of)
        return outcome

    # -- latencies from the two topics -------------------------------------------------------------
    def _read_all(self, topic: str) -> list:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"lat-{uuid.uuid4().hex}",
                             "enable.auto.commit": False})
        out = []
        for p in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            consumer.assign([TopicPartition(topic, p, low)])
            while high > low:
                msg = consumer.poll(5)
                if msg is None:
                    raise TimeoutError(f"{topic}[{p}]: no message after offset {low} of {high}")
                if msg.error():
                    continue
                out.append((*record_of(msg), msg.timestamp()[1]))
                low = (msg.offset() or low) + 1
        consumer.close()
        return out

    def measure(self, outcome: Outcome, workload: Workload, topic_in: str, topic_out: str, phase_of: dict) -> None:
        nth: dict[str, int] = {}
        appended: dict = {}
        for key, value, ts in self._read_all(topic_in):  # partition by partition, each in offset order
            nth[key] = nth.get(key, 0) + 1
            marker = workload.input_marker(value, nth[key])
            if marker is not None:
                appended[(key, marker)] = ts
        outputs = [(key, Workload.marker_of(outcome.workload, value), ts)
                   for key, value, ts in self._read_all(topic_out) if not key.startswith("probe")]
        by_phase, backlog_end = phase_latencies(outcome.phases, appended, outputs, phase_of)
        unmarked = unmarked_by_phase(outcome.phases, outputs)
        for name, ph in outcome.phases.items():
            entry = {"sent": ph.sent, "rate": ph.rate, **summarize(by_phase[name]), "unmarked_out": unmarked[name]}
            if name == "backlog" and backlog_end:
                entry["sustained_events_per_s"] = round(ph.sent / max(0.001, (backlog_end - ph.start_ms) / 1000), 1)
            outcome.phases[name] = entry


def phase_latencies(phases: dict[str, Phase], appended: dict, outputs: list, phase_of: dict
                    ) -> tuple[dict[str, list[float]], float | None]:
    """Each phase's latencies: an output record's append time minus its input's (``appended``, by
    (key, marker)), in the phase that sent that input (``phase_of``), leaving out a rate phase's
    first :data:`SETTLE_S` seconds; and the last append time of the backlog's outputs. An input is
    counted in the phase that sent it, not by when it was appended: a phase that follows another
    at once (the first rate phase after the floor) would otherwise lend it its first records."""
    by_phase: dict[str, list[float]] = {name: [] for name in phases}
    backlog_end = None
    for key, marker, ts in outputs:
        t_in = appended.get((key, marker))
        name = phase_of.get((key, marker))
        if t_in is None or name not in phases:
            continue
        ph = phases[name]
        if ph.rate and t_in < ph.start_ms + SETTLE_S * 1000:
            continue
        by_phase[name].append(ts - t_in)
        if name == "backlog":
            backlog_end = max(backlog_end or 0, ts)
    return by_phase, backlog_end


def unmarked_by_phase(phases: dict[str, Phase], outputs: list) -> dict[str, int]:
    """How many output records that reflect no measured input (sessions closed by their gap, not
    by a last event) were appended while each phase ran: from its start to the next phase's.
    A batch that closes many such sessions at once delays every record behind it, so this shows
    which phase a wave of them fell in.

    >>> a, b = Phase("floor", start_ms=0.0), Phase("1000/s", start_ms=10.0)
    >>> unmarked_by_phase({"floor": a, "1000/s": b}, [("k", None, 5.0), ("k", "e1", 6.0), ("j", None, 12.0), ("i", None, 99.0)])
    {'floor': 1, '1000/s': 2}
    """
    names = sorted(phases, key=lambda n: phases[n].start_ms)
    starts = [phases[n].start_ms for n in names]
    out = dict.fromkeys(phases, 0)
    for _key, marker, ts in outputs:
        if marker is None:
            at = bisect.bisect_right(starts, ts) - 1
            if at >= 0:
                out[names[at]] += 1
    return out


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:,.0f}"


def table(outcomes: list[Outcome], workload: str) -> str:
    rows = [o for o in outcomes if o.workload == workload]
    if not rows:
        return ""
    done = [o for o in rows if o.error is None]
    phases = [n for n in done[0].phases if n != "warm-up"] if done else []
    head = ["contender", "floor p50", "floor p99"]
    for n in phases:
        if n not in ("floor", "backlog"):
            head += [f"{n} p50", f"{n} p95", f"{n} p99"]
    head += ["sustained ev/s"]
    lines = [f"## {workload} (latency in ms: output append time - newest input's append time)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for o in rows:
        if o.error:
            lines.append(f"| {o.contender} | error: {o.error[:120]} |")
            continue
        cells = [o.contender, _fmt(o.phases["floor"]["p50"]), _fmt(o.phases["floor"]["p99"])]
        for n in phases:
            if n not in ("floor", "backlog"):
                cells += [_fmt(o.phases[n][k]) for k in ("p50", "p95", "p99")]
        cells.append(_fmt(o.phases.get("backlog", {}).get("sustained_events_per_s")))
        lines.append("| " + " | ".join(cells) + " |")
    waves = [f"{o.contender}: " + ", ".join(f"{n} {ph['unmarked_out']:,}" for n, ph in o.phases.items()
                                            if ph.get("unmarked_out"))
             for o in done if any(ph.get("unmarked_out") for ph in o.phases.values())]
    if waves:
        lines += ["", "Output appended in each phase that no measured input is behind (sessions closed by"
                  " their gap): " + "; ".join(waves)]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.latency", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=("count", "sessions", "all"), default="all")
    p.add_argument("--contenders", nargs="*",
                   help="names (prefixes) to run, and variants CONTENDER+SETTING=VALUE; default: all of the workload")
    p.add_argument("--variants", nargs="*", default=None, metavar="CONTENDER+SETTING=VALUE",
                   help="more contenders, each a contender with settings changed (+ between several; default,"
                        " without --contenders: docs/performance.md's settings table, DOCUMENTED_VARIANTS): "
                        + "; ".join(f"{k}: {v.help}" for k, v in SETTINGS.items()))
    p.add_argument("--keys", type=int, default=50_000)
    p.add_argument("--rates", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 10000],
                   help="events/s of the rate phases, comma-separated (default: 1000,10000)")
    p.add_argument("--seconds", type=float, default=30.0, help="length of each rate phase (default: 30)")
    p.add_argument("--floor", type=int, default=30, help="single records of the floor phase (default: 30)")
    p.add_argument("--backlog", type=int, default=200_000, help="events of the backlog phase (0: none)")
    p.add_argument("--run-trigger", default=None, help="--trigger for sparkstate run's job (default: its own)")
    p.add_argument("--run-triggers", type=lambda s: [t.strip() for t in s.split(",") if t.strip()], default=[],
                   help="more sparkstate run jobs, one per trigger (comma-separated, e.g. '100 milliseconds'):"
                        " the variants sparkstate-run+trigger=TRIGGER")
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--work", default=None,
                   help="keep the contenders' logs, checkpoints, progress reports and metrics in this directory")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 2,000 keys, one 200 events/s phase of 5 s, 3 floor records, 5,000 backlog")
    args = p.parse_args(argv)
    try:
        for w in ["count", "sessions"] if args.workload == "all" else [args.workload]:
            plan(args, w)
    except ValueError as exc:
        p.error(str(exc))
    if args.quick:
        args.keys, args.rates, args.seconds, args.floor, args.backlog = 2000, [200], 5.0, 3, 5000
    return args


def main(argv: list[str] | None = None) -> int:
    from sparkstate.io import kafka_broker

    from .jvm import build_jar

    args = parse_args(sys.argv[1:] if argv is None else argv)
    workloads = ["count", "sessions"] if args.workload == "all" else [args.workload]
    minor = pyspark_minor()
    for w in workloads:  # said before a JVM or the broker starts
        for name in left_out(args, w):
            print(f"{w}: {name} does not run on PySpark {minor[0]}.{minor[1]}; left out", flush=True)
    if not any(plan(args, w) for w in workloads):
        print(f"latency: no contender to run on PySpark {minor[0]}.{minor[1]}", file=sys.stderr)
        return 2
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="sparkstate-latency-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        jar = str(build_jar(work / "bench.jar"))
        with kafka_broker.start() as broker:
            bench = Bench(args, broker.bootstrap, jar, work)
            for w in workloads:
                for variant in plan(args, w):
                    print(f"{w}: {variant.name} ...", flush=True)
                    outcomes.append(bench.run_one(variant, w))
                    if outcomes[-1].error:
                        print(f"  error: {outcomes[-1].error}", flush=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / f"latency-{stamp}.json"
        out.write_text(json.dumps({"args": vars(args), "load": os.getloadavg(),
                                   "outcomes": [asdict(o) for o in outcomes]}, indent=1, default=str))
    for w in workloads:
        print(table(outcomes, w) + "\n")
    print(f"results: {out}")
    return 1 if any(o.error for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
