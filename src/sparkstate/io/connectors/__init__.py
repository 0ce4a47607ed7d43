"""The one place that decides which Maven artifacts sparkstate's Kafka support uses, and fetches them.

Three groups of jars, each named by Maven coordinates:

- ``spark-kafka``: Spark's Kafka connector (:data:`SPARK_KAFKA`), what ``kafka:`` sources and
  sinks need inside Spark. Users put it on Spark's classpath with ``--packages`` (the
  coordinates :func:`kafka_coordinates` returns) or ``spark.jars`` (local jar files).
- ``kafka-broker``: an Apache Kafka broker (:data:`KAFKA_BROKER`), run as a single-node KRaft
  server by the tests and by ``sparkstate demo --kafka``.
- ``hadoop-aws``: S3A for ``s3a://`` paths (:func:`s3a_packages`): ``hadoop-aws`` of the Hadoop
  version pyspark ships, with the AWS SDK v2 modules it needs instead of the SDK's 600 MB bundle
  (:data:`HADOOP_AWS_VERSIONS`, :data:`S3A_EXCLUSIONS`).
- ``s3proxy``: S3Proxy (:data:`S3PROXY`), the S3-compatible server the tests start on loopback.
- ``delta-spark``: Delta Lake's Spark connector, on the minors listed in :data:`DELTA_SPARK`
  (3.5): with it on the classpath the ``delta:`` sink writes each batch from the executors
  (:mod:`sparkstate.io.delta`); without it, or on another minor, from the driver with delta-rs.

Which connector goes with which pyspark comes from one table, :data:`PYSPARK_VERSIONS`, keyed by
pyspark minor: the supported minors, the patch release of each that the test suite runs (the
main suite on :data:`MAIN_MINOR`, a core subset on the others), and the Kafka connector release
to use with it, the newest of that minor Maven resolves from Maven Central. pyspark 4.3 has no connector
release on Maven Central; the 4.2.0 connector was measured to work with pyspark 4.3.0 (the
whole Kafka test suite runs on it), so the table maps 4.3 to it.

``sparkstate.io.connectors.main(["fetch"])`` (run by ``make kafka``, which ``make test`` runs)
resolves the Kafka groups, and ``delta-spark`` where the minor has one (``main(["fetch", "hadoop-aws", "s3proxy"])``: ``make s3``) with Maven into Maven's local repository (``~/.m2`` unless configured)
and writes the group's jar paths to ``CACHE/NAME.classpath``; ``CACHE`` is
``$SPARKSTATE_CACHE``, else ``~/.cache/sparkstate``. Nothing is downloaded at run time.

>>> kafka_coordinates("4.3.0")
'org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0'
>>> kafka_coordinates("4.1.4")
'org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1'
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ...errors import ConfigError
from ...paths import cache_dir

SCALA = "2.13"
#: Spark's Kafka connector for Scala :data:`SCALA`, without its version (:func:`kafka_coordinates`
#: adds the version, and the Scala suffix of the minor: :data:`SCALA_VERSIONS`).
SPARK_KAFKA = f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}"
#: Supported pyspark minor -> (the patch release the tests run, the Kafka connector release to use).
#: The connector is the newest release of that minor whose dependencies all resolve from Maven
#: Central (4.1.2 and 4.1.3 lack their spark-token-provider-kafka, 4.0.1-4.0.4 and 3.5.8-3.5.9
#: too; 4.3 has none at all: 4.2.0, measured to work with pyspark 4.3.0). The one table behind
#: ``make kafka``, ``sparkstate run``, the missing-connector error, pyproject's pyspark bounds and
#: the version matrix in the tests.
PYSPARK_VERSIONS: dict[str, tuple[str, str]] = {
    "3.5": ("3.5.9", "3.5.7"),
    "4.0": ("4.0.5", "4.0.0"),
    "4.1": ("4.1.4", "4.1.1"),
    "4.2": ("4.2.1", "4.2.0"),
    "4.3": ("4.3.0", "4.2.0"),
}
#: pyspark minor -> the Scala version its jars are built for (:data:`SCALA` where not listed).
SCALA_VERSIONS = {"3.5": "2.12"}
#: The minor the whole test suite runs on; the others run a core subset (tests/versions).
MAIN_MINOR = "4.3"
#: The other supported minors -> the pyspark release the version matrix installs.
MATRIX_PYSPARK = {m: tested for m, (tested, _) in PYSPARK_VERSIONS.items() if m != MAIN_MINOR}
#: pyspark minor -> Kafka connector release (kept for callers of the earlier name).
CONNECTOR_VERSIONS = {m: conn for m, (_, conn) in PYSPARK_VERSIONS.items()}
#: The Kafka broker run by the tests and ``sparkstate demo --kafka`` (single-node KRaft).
KAFKA_VERSION = "4.1.1"
KAFKA_BROKER = f"org.apache.kafka:kafka_{SCALA}:{KAFKA_VERSION}"
#: Resolved beside the broker (nothing so far: its storage formatter and log4j binding come with it).
KAFKA_BROKER_EXTRA: tuple[str, ...] = ()
#: Spark's Hadoop version (the ``hadoop-client-api`` jar pyspark ships) -> (AWS SDK v2 release,
#: analytics-accelerator release) that ``org.apache.hadoop:hadoop-aws`` of that version was built
#: against. hadoop-aws must be the same version as Spark's Hadoop; instead of the SDK's 600 MB
#: ``bundle`` (its declared dependency), the SDK modules in :data:`AWS_SDK_MODULES` are used.
HADOOP_AWS_VERSIONS: dict[str, tuple[str, str]] = {
    "3.5.0": ("2.35.4", "1.3.1"),
}
#: The AWS SDK v2 modules S3A needs (``netty-nio-client`` comes with ``s3``: S3A uploads through it).
AWS_SDK_MODULES = ("s3", "s3-transfer-manager", "sts")
#: Left out of the S3A jars: the SDK bundle (replaced by the modules above) and what Spark ships
#: itself (netty 4.2, slf4j, commons-logging/codec, Apache httpclient).
S3A_EXCLUSIONS = ("software.amazon.awssdk:bundle", "io.netty:*", "org.slf4j:*", "commons-logging:*",
                  "commons-codec:*", "org.apache.httpcomponents:*")
#: The S3-compatible server the tests start on loopback (in-memory ``transient`` storage).
S3PROXY = "org.gaul:s3proxy:2.7.0"

MAKE_HINT = ("run `python -m sparkstate.io.connectors fetch` (`make kafka` in a sparkstate checkout;"
             " needs Maven and Java 17)")
S3_MAKE_HINT = ("run `python -m sparkstate.io.connectors fetch hadoop-aws s3proxy` (`make s3` in a sparkstate"
                " checkout; needs Maven and Java 17)")


def pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


def connector_version(spark_version: str | None = None) -> str:
    """The version of Spark's Kafka connector to use with ``spark_version`` (default: the installed pyspark).

    From :data:`PYSPARK_VERSIONS` for a supported minor; for any other, the same version as pyspark.

    >>> connector_version("4.2.1"), connector_version("4.3.0"), connector_version("5.0.0")
    ('4.2.0', '4.2.0', '5.0.0')
    """
    v = spark_version or pyspark_version()
    minor = ".".join(v.split(".")[:2])
    return CONNECTOR_VERSIONS.get(minor, v.split("+")[0])


def kafka_coordinates(spark_version: str | None = None) -> str:
    """The Maven coordinates of Spark's Kafka connector for a pyspark version (default: the one installed),
    for ``--packages`` / ``spark.jars.packages``; :func:`sparkstate.io.sources.kafka_package` asks for a session's.

    >>> kafka_coordinates("4.0.5"), kafka_coordinates("3.5.9")
    ('org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0', 'org.apache.spark:spark-sql-kafka-0-10_2.12:3.5.7')
    """
    v = spark_version or pyspark_version()
    scala = SCALA_VERSIONS.get(".".join(v.split(".")[:2]), SCALA)
    return f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{connector_version(v)}"


#: pyspark minor -> the delta-spark release the ``delta:`` sink writes with there (from the
#: executors); Delta's Spark integration is built per Spark minor, and only these are tested.
DELTA_SPARK = {"3.5": "io.delta:delta-spark_2.12:3.3.2"}
#: The class delta-spark's ``format("delta")`` resolves to.
DELTA_DATA_SOURCE = "org.apache.spark.sql.delta.sources.DeltaDataSource"
#: The session settings delta-spark's writes need (static: set when the session starts).
DELTA_SESSION = {"spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
                 "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog"}


def delta_coordinates(spark_version: str | None = None) -> str | None:
    """The delta-spark coordinates the ``delta:`` sink writes with on ``spark_version`` (default:
    the installed pyspark), or None where it writes with delta-rs only.

    >>> delta_coordinates("3.5.9"), delta_coordinates("4.3.0")
    ('io.delta:delta-spark_2.12:3.3.2', None)
    """
    v = spark_version or pyspark_version()
    return DELTA_SPARK.get(".".join(v.split(".")[:2]))


def hadoop_version() -> str:
    """The Hadoop version pyspark ships (from its ``hadoop-client-api`` jar)."""
    import pyspark

    for p in sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")):
        return p.name[len("hadoop-client-api-"):-len(".jar")]
    raise ConfigError("pyspark ships no hadoop-client-api jar: cannot tell which hadoop-aws to use")


def s3a_packages(hadoop: str | None = None) -> list[str]:
    """The Maven coordinates S3A (``s3a://`` paths) needs beside pyspark's Hadoop ``hadoop``.

    >>> s3a_packages("3.5.0")[:2]
    ['org.apache.hadoop:hadoop-aws:3.5.0', 'software.amazon.awssdk:s3:2.35.4']
    """
    h = hadoop or hadoop_version()
    if h not in HADOOP_AWS_VERSIONS:
        raise ConfigError(f"no AWS SDK version is recorded for Hadoop {h} (sparkstate.io.connectors.HADOOP_AWS_VERSIONS)")
    sdk, accel = HADOOP_AWS_VERSIONS[h]
    return [f"org.apache.hadoop:hadoop-aws:{h}", *(f"software.amazon.awssdk:{m}:{sdk}" for m in AWS_SDK_MODULES),
            f"software.amazon.s3.analyticsaccelerator:analyticsaccelerator-s3:{accel}"]


#: The groups ``make kafka`` fetches (and ``delta-spark`` where the minor has one:
#: :func:`default_groups`); ``make s3`` fetches :data:`S3_GROUPS`.
KAFKA_GROUPS = ("spark-kafka", "kafka-broker")
S3_GROUPS = ("hadoop-aws", "s3proxy")
#: Group -> Maven exclusions applied to each of its dependencies ("groupId:artifactId", ``*`` allowed).
EXCLUSIONS: dict[str, tuple[str, ...]] = {"hadoop-aws": S3A_EXCLUSIONS}


def groups(spark_version: str | None = None) -> dict[str, list[str]]:
    """Each jar group's Maven coordinates (resolved with their dependencies)."""
    out = {
        "spark-kafka": [kafka_coordinates(spark_version)],
        "kafka-broker": [KAFKA_BROKER, *KAFKA_BROKER_EXTRA],
        "s3proxy": [S3PROXY],
    }
    delta = delta_coordinates(spark_version)
    if delta is not None:
        out["delta-spark"] = [delta]
    try:
        out["hadoop-aws"] = s3a_packages()
    except ConfigError:
        pass
    return out


def default_groups() -> tuple[str, ...]:
    """What ``fetch`` with no group names resolves: the Kafka groups, and ``delta-spark`` where
    this pyspark's minor has one."""
    return KAFKA_GROUPS + (("delta-spark",) if delta_coordinates() else ())


def _classpath_file(name: str) -> Path:
    return cache_dir() / f"{name}.classpath"


def _pyspark_jar_names() -> set[str]:
    """The artifact names (file name less the version) of the jars pyspark ships."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    return {_artifact(p.name) for p in jars.glob("*.jar")}


def _artifact(filename: str) -> str:
    stem = filename[:-4] if filename.endswith(".jar") else filename
    parts = stem.split("-")
    for i, part in enumerate(parts):
        if part[:1].isdigit() and i > 0:
            return "-".join(parts[:i])
    return stem


def jars(name: str) -> list[str]:
    """The local jar paths of a fetched group; a :class:`~sparkstate.errors.ConfigError` saying how to fetch it if missing.

    For ``spark-kafka``, ``delta-spark`` and ``hadoop-aws``, jars pyspark already ships (Hadoop, Scala, compression codecs) are left out.
    """
    path = _classpath_file(name)
    all_groups = groups()
    if name not in all_groups:
        raise ConfigError(f"no jars are known for {name} with this pyspark (Hadoop {hadoop_version()})")
    want = all_groups[name]
    if path.exists():
        lines = path.read_text(encoding="utf-8").splitlines()
        if lines and lines[0] == "# " + " ".join(want):
            found = [p for p in lines[1:] if p]
            if found and all(Path(p).exists() for p in found):
                if name in ("spark-kafka", "delta-spark", "hadoop-aws"):
                    shipped = _pyspark_jar_names()
                    found = [p for p in found if _artifact(Path(p).name) not in shipped]
                return found
    hint = S3_MAKE_HINT if name in S3_GROUPS else MAKE_HINT
    raise ConfigError(f"the jars of {', '.join(want)} are not fetched ({path} missing or stale): {hint}")


def fetched(name: str) -> bool:
    try:
        jars(name)
        return True
    except ConfigError:
        return False


def _pom(coordinates: list[str], exclusions: tuple[str, ...] = ()) -> str:
    excl = "".join(f"<exclusion><groupId>{e.split(':')[0]}</groupId><artifactId>{e.split(':')[1]}</artifactId></exclusion>"
                   for e in exclusions)
    excl = f"<exclusions>{excl}</exclusions>" if excl else ""
    deps = []
    for c in coordinates:
        g, a, v = c.split(":")
        deps.append(f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>{excl}</dependency>")
    return ("<project xmlns=\"http://maven.apache.org/POM/4.0.0\"><modelVersion>4.0.0</modelVersion>"
            "<groupId>sparkstate</groupId><artifactId>fetch</artifactId><version>0</version>"
            f"<dependencies>{''.join(deps)}</dependencies></project>\n")


def fetch(names: list[str] | None = None, *, quiet: bool = True) -> dict[str, Path]:
    """Resolve the groups ``names`` (default: :func:`default_groups`) with Maven; write their classpath files; return them."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigError("fetching the connector jars needs Maven (`mvn`) on PATH, and Java 17")
    out: dict[str, Path] = {}
    cache_dir().mkdir(parents=True, exist_ok=True)
    all_groups = groups()
    for name in names or default_groups():
        if name not in all_groups:
            raise ConfigError(f"no jars are known for {name} with this pyspark")
        coords = all_groups[name]
        if fetched(name):
            out[name] = _classpath_file(name)
            continue
        with tempfile.TemporaryDirectory(prefix="sparkstate-fetch-") as tmp:
            (Path(tmp) / "pom.xml").write_text(_pom(coords, EXCLUSIONS.get(name, ())), encoding="utf-8")
            listing = Path(tmp) / "cp.txt"
            cmd = [mvn, "-B", "dependency:build-classpath", f"-Dmdep.outputFile={listing}", "-Dmdep.includeScope=runtime"]
            if quiet:
                cmd.insert(2, "-q")
            res = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
            if res.returncode != 0:
                raise ConfigError(f"Maven could not resolve {', '.join(coords)}:\n{res.stdout[-3000:]}{res.stderr[-2000:]}")
            paths = [p for p in listing.read_text(encoding="utf-8").strip().split(os.pathsep) if p]
        target = _classpath_file(name)
        tmp_target = target.with_suffix(".tmp")
        tmp_target.write_text("# " + " ".join(coords) + "\n" + "\n".join(paths) + "\n", encoding="utf-8")
        tmp_target.replace(target)
        out[name] = target
    return out


#: The class Spark's Kafka connector provides.
KAFKA_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def kafka_connector_available(spark) -> bool | None:
    """Whether Spark's Kafka connector is on the driver's classpath (``None``: cannot tell, e.g. Spark Connect)."""
    return class_available(spark, KAFKA_PROVIDER)


def class_available(spark, name: str) -> bool | None:
    """Whether the class ``name`` is on the driver's classpath (``None``: cannot tell, e.g. Spark Connect)."""
    from ...spark import is_connect

    jvm = None if is_connect(spark) else getattr(spark, "_jvm", None)
    if jvm is None:
        return None
    try:
        loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        jvm.java.lang.Class.forName(name, False, loader)
        return True
    except Exception:
        return False


def kafka_missing(spark_version: str, what: str) -> ConfigError:
    """The error for a Kafka source or sink when the connector is not on Spark's classpath: how to add it."""
    pkg = kafka_coordinates(spark_version)
    conn = connector_version(spark_version)
    note = ""
    if conn.split(".")[:2] != spark_version.split(".")[:2]:
        note = f" (Maven Central has no Kafka connector for Spark {spark_version}; the {conn} one works with it)"
    return ConfigError(
        f"{what}: Spark's Kafka connector is not on the classpath (class {KAFKA_PROVIDER} not found;"
        f" the pyspark package does not ship it). Add it when Spark starts{note}: sparkstate run --packages {pkg},"
        f" spark-submit --packages {pkg}, PYSPARK_SUBMIT_ARGS='--packages {pkg} pyspark-shell',"
        f" or SparkSession.builder.config('spark.jars.packages', '{pkg}');"
        f" offline: `python -m sparkstate.io.connectors fetch` (`make kafka`) fetches the jars and sparkstate run"
        f" then uses them (spark.jars)"
    )


def require_kafka_connector(spark, what: str) -> None:
    """Raise :func:`kafka_missing`'s error unless the connector is on ``spark``'s classpath."""
    if kafka_connector_available(spark) is False:
        raise kafka_missing(spark.version, what)


def spark_settings(packages: str | None = None, jars_: str | None = None, *, kafka: bool = False,
                   s3a: bool = False, delta: bool = False) -> dict[str, str]:
    """Spark settings that put connectors on the classpath of a session sparkstate starts.

    ``packages``: Maven coordinates (``spark.jars.packages``, resolved by Spark at start);
    ``jars_``: local jar paths (``spark.jars``). With neither and ``kafka`` true, the jars
    ``make kafka`` fetched are used when they are there; with ``s3a`` true, the jars ``make s3``
    fetched (hadoop-aws and the AWS SDK modules) are added to those when they are there; with
    ``delta`` true, likewise the delta-spark jars ``fetch`` resolved for this minor (3.5), with
    the session settings Delta needs (:data:`DELTA_SESSION`).

    >>> spark_settings("g:a:1")
    {'spark.jars.packages': 'g:a:1'}
    """
    out: dict[str, str] = {}
    if packages:
        out["spark.jars.packages"] = packages
    if jars_:
        out["spark.jars"] = jars_
    if kafka and not out and fetched("spark-kafka"):
        out["spark.jars"] = ",".join(jars("spark-kafka"))
    if s3a and "spark.jars.packages" not in out and fetched("hadoop-aws"):
        out["spark.jars"] = ",".join(filter(None, [out.get("spark.jars"), *jars("hadoop-aws")]))
    if delta and "spark.jars.packages" not in out and delta_coordinates() and fetched("delta-spark"):
        out["spark.jars"] = ",".join(filter(None, [out.get("spark.jars"), *jars("delta-spark")]))
        out.update(DELTA_SESSION)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("fetch", "coordinates", "jars"):
        print("usage: python -m sparkstate.io.connectors fetch [GROUP...] | coordinates | jars GROUP", file=sys.stderr)
        return 2
    try:
        if args[0] == "fetch":
            for name, path in fetch(args[1:] or None).items():
                print(f"{name}: {path}")
        elif args[0] == "coordinates":
            for name, coords in groups().items():
                print(f"{name}: {' '.join(coords)}")
        else:
            print(",".join(jars(args[1])))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
