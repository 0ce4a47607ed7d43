"""A throwaway single-node Apache Kafka broker (KRaft: broker and controller in one JVM) on localhost.

Started from the jars :mod:`sparkstate.io.connectors` fetched (``make kafka``), on free
127.0.0.1 ports, with its data in a temporary directory; used by the tests (one broker per
test session) and by ``sparkstate demo --kafka``. Not for production: one replica, no
authentication, data deleted on :meth:`LocalKafka.stop`.

>>> from sparkstate.io.kafka_broker import server_properties
>>> "process.roles=broker,controller" in server_properties(9092, 9093, "/tmp/k")
True
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from ..errors import ConfigError
from . import connectors

#: JVM heap of the broker: the tests' topics are tiny.
HEAP = "-Xmx384m"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_properties(port: int, controller_port: int, log_dir: str) -> str:
    """The broker's ``server.properties``: one node that is broker and controller, on 127.0.0.1."""
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        f"log.dirs={log_dir}",
        "num.partitions=1",
        "auto.create.topics.enable=false",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "log.flush.interval.messages=1000000",
        "",
    ])


class LocalKafka:
    """A running broker: ``bootstrap`` is ``127.0.0.1:PORT``. Use as a context manager, or call :meth:`stop`.

    :meth:`kill` and :meth:`restart` make an outage (a SIGKILL, then the same broker again on the
    same ports and log directory), for the tests of a job that outlives its broker.
    """

    def __init__(self, root: Path, proc: subprocess.Popen, port: int, command: list[str] | None = None) -> None:
        self.root = root
        self.proc = proc
        self.port = port
        self.command = command  # how the broker was started (to start it again)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> "LocalKafka":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join((self.root / "broker.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 20 s) and delete its data."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the broker (a crash: nothing is flushed or handed over); its data stays for :meth:`restart`."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(30)

    def restart(self, timeout_s: float = 180.0) -> None:
        """Start the broker again on its log directory and ports (after :meth:`kill`); return once it
        answers metadata requests. Recovering the log after a SIGKILL takes it some seconds."""
        if self.proc.poll() is None:
            raise RuntimeError("the Kafka broker is running; kill() it first")
        if self.command is None:
            raise RuntimeError("this broker was not started by sparkstate.io.kafka_broker.start()")
        self.proc = _launch(self.command, self.root)
        _wait_ready(self, timeout_s, stop_on_failure=False)

    def wait_for_leaders(self, topic: str, timeout_s: float = 120.0) -> None:
        """Wait until every partition of ``topic`` has a leader again (after a restart)."""
        admin = self.admin()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                md = admin.list_topics(topic, timeout=5).topics.get(topic)
            except Exception:  # the broker is still starting
                md = None
            if md is not None and md.error is None and md.partitions \
                    and all(p.leader >= 0 for p in md.partitions.values()):
                return
            time.sleep(0.2)
        raise RuntimeError(f"topic {topic}: partitions have no leader {timeout_s:.0f} s after the restart")

    # --- helpers for producers and topics (need confluent-kafka: the `kafka` extra) ---------

    def admin(self):
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, name: str, partitions: int = 1) -> None:
        from confluent_kafka.admin import NewTopic

        admin = self.admin()  # kept alive until the answer is in
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        futures[name].result(60)
        # wait until every partition has a leader that the metadata shows
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            md = admin.list_topics(name, timeout=10).topics.get(name)
            if md is not None and md.error is None and len(md.partitions) == partitions \
                    and all(p.leader >= 0 for p in md.partitions.values()):
                return
            time.sleep(0.1)
        raise RuntimeError(f"topic {name}: partitions have no leader after 60 s")

    def produce(self, topic: str, messages, *, partition: int | None = None) -> list[tuple[int, int]]:
        """Send ``messages`` (values, or ``(key, value)`` pairs; str or bytes) and wait for every ack.

        Returns each message's ``(partition, offset)``, in the order given.
        """
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": True})
        errors: list[str] = []
        where: list[tuple[int, int] | None] = []

        def delivered(i: int):
            def on_delivery(err, msg) -> None:
                if err is not None:
                    errors.append(str(err))
                else:
                    where[i] = (msg.partition(), msg.offset())
            return on_delivery

        n = 0
        for m in messages:
            key, value = m if isinstance(m, tuple) else (None, m)
            where.append(None)
            kwargs = {"value": value, "key": key, "on_delivery": delivered(n)}
            if partition is not None:
                kwargs["partition"] = partition
            while True:
                try:
                    producer.produce(topic, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.1)
            n += 1
            producer.poll(0)
        left = producer.flush(60)
        if left or errors:
            raise RuntimeError(f"producing to {topic}: {left} undelivered, errors: {errors[:3]}")
        return where  # type: ignore[return-value]

    def consume_all(self, topic: str, *, timeout_s: float = 60.0) -> list:
        """Every message now in ``topic`` (all partitions, from the start), as confluent-kafka messages."""
        from confluent_kafka import Consumer, TopicPartition

        md = self.admin().list_topics(topic, timeout=10).topics[topic]
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"sparkstate-read-{uuid.uuid4().hex}",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        try:
            ends = {}
            for p in md.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                ends[p] = (low, high)
            consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in ends.items()])
            want = {p: high for p, (_, high) in ends.items() if high > 0}
            out = []
            pos = {p: ends[p][0] for p in ends}
            deadline = time.monotonic() + timeout_s
            while any(pos[p] < h for p, h in want.items()):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"reading {topic}: stopped at {pos}, end offsets {want}")
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    raise RuntimeError(f"reading {topic}: {msg.error()}")
                out.append(msg)
                offset = msg.offset()
                if offset is not None:
                    pos[msg.partition()] = offset + 1
            return out
        finally:
            consumer.close()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the broker gets SIGTERM when the process that started it dies (a killed test run)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise ConfigError("the local Kafka broker needs Java 17 (`java` on PATH or JAVA_HOME)")
    return found


def _ready(port: int) -> bool:
    """The broker answers a metadata request (not just an open port)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            pass
    except OSError:
        return False
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:  # without the client: the listener accepting connections is the best sign
        return True
    try:
        md = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "socket.timeout.ms": 2000}).list_topics(timeout=2)
        return md.controller_id >= 0 or len(md.brokers) > 0
    except Exception:
        return False


def start(timeout_s: float = 120.0) -> LocalKafka:
    """Format a new KRaft log directory and start the broker; return once it answers metadata requests."""
    classpath = os.pathsep.join(connectors.jars("kafka-broker"))
    java = _java()
    root = Path(tempfile.mkdtemp(prefix="sparkstate-kafka-"))
    port, cport = free_port(), free_port()
    while cport == port:
        cport = free_port()
    props = root / "server.properties"
    props.write_text(server_properties(port, cport, str(root / "data")), encoding="utf-8")
    cluster_id = "-"
    while cluster_id.startswith("-"):  # as Kafka's own ids: one starting with "-" reads as an option
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    base = [java, HEAP, "-Djava.awt.headless=true", "-cp", classpath]
    fmt = subprocess.run(base + ["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)],
                         capture_output=True, text=True, timeout=120)
    if fmt.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"formatting the Kafka log directory failed:\n{fmt.stdout}\n{fmt.stderr}")
    command = base + ["kafka.Kafka", str(props)]
    broker = LocalKafka(root, _launch(command, root), port, command)
    _wait_ready(broker, timeout_s, stop_on_failure=True)
    return broker


def _launch(command: list[str], root: Path) -> subprocess.Popen:
    with open(root / "broker.log", "ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_parent)


def _wait_ready(broker: LocalKafka, timeout_s: float, *, stop_on_failure: bool) -> None:
    deadline = time.monotonic() + timeout_s
    while not _ready(broker.port):
        failed = None
        if broker.proc.poll() is not None:
            failed = f"the Kafka broker exited with {broker.proc.returncode}"
        elif time.monotonic() > deadline:
            failed = f"the Kafka broker did not answer within {timeout_s:.0f} s"
        if failed:
            tail = broker.log_tail()
            if stop_on_failure:
                broker.stop()
            else:
                broker.kill()
            raise RuntimeError(f"{failed}:\n{tail}")
        time.sleep(0.2)


__all__ = ["LocalKafka", "free_port", "server_properties", "start"]
