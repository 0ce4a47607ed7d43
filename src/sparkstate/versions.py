"""What the installed PySpark offers: the one place that knows which minor has what.

- ``transformWithStateInPandas`` (4.0 and later): the batched engine, and the tws engine (with
  Spark's per-key TTL, ``state_ttl``) on 4.0, its rows handed over as pandas frames.
- ``transformWithState`` with Rows (4.1 and later): the tws engine takes Rows (the same state
  and TTL as on 4.0, without the pandas round trip).
- ``applyInPandasWithState`` (3.4 and later): the inband engine, the default where the two
  above are absent.
- ``DataFrame.toArrow`` (4.0 and later): :func:`~sparkstate.engines.runtime.collect_arrow` (the postgres and delta sinks'
  driver-side writers), from PySpark 3.5's Arrow batches there.
- the ``statestore`` and ``state-metadata`` readers (4.0 and later): the state tools; on 3.5
  they open Spark's state store on the driver instead (:mod:`sparkstate.engines.driver_state`).
- observed metrics (``DataFrame.observe``) in the progress of a batch without input (4.0 and
  later; 3.5 reports none there): a job's counts of such a batch (``sparkstate.jobs.tee``).
- Python workers on Unix domain sockets (``spark.python.unix.domain.socket.enabled``, 4.1 and
  later): :func:`sparkstate.spark.default_config` turns them on.

>>> minor_of("3.5.9"), minor_of("4.0.5"), minor_of("4.3.0.dev1")
((3, 5), (4, 0), (4, 3))
"""

from __future__ import annotations

from .errors import ConfigError

#: The first PySpark minor with each feature sparkstate uses.
TRANSFORM_WITH_STATE_IN_PANDAS = (4, 0)
TRANSFORM_WITH_STATE_ROWS = (4, 1)
STATE_READERS = (4, 0)
OBSERVED_WITHOUT_INPUT = (4, 0)
PYTHON_UNIX_SOCKETS = (4, 1)


def minor_of(version: str) -> tuple[int, int]:
    try:
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


def pyspark_minor() -> tuple[int, int]:
    """The installed pyspark's (major, minor)."""
    import pyspark

    return minor_of(pyspark.__version__)


def has(feature: tuple[int, int]) -> bool:
    """Whether the installed pyspark has ``feature`` (one of the constants above)."""
    return pyspark_minor() >= feature


def _name(minor: tuple[int, int]) -> str:
    return f"{minor[0]}.{minor[1]}"


def require(feature: tuple[int, int], what: str, way_out: str) -> None:
    """Raise a one-line :class:`ConfigError` when the installed pyspark lacks ``feature``."""
    if not has(feature):
        raise ConfigError(f"{what} needs PySpark {_name(feature)} or later; this is PySpark"
                          f" {_name(pyspark_minor())}. {way_out}")
