"""What the installed PySpark offers the engines: the one place that knows which minor has what.

- ``transformWithStateInPandas`` (4.0 and later): the batched engine.
- ``transformWithState`` with Rows (4.1 and later): the tws engine, and Spark's per-key TTL
  (``state_ttl``) through it.
- ``applyInPandasWithState`` (3.4 and later): the inband engine, the default where the two
  above are absent.
- the ``statestore`` and ``state-metadata`` readers (4.0 and later): the state tools on the
  tws and batched engines' checkpoints.
- observed metrics (``DataFrame.observe``) in the progress of a batch without input (4.0 and
  later; 3.5 reports none there): a job's counts of such a batch (``sparkstate.jobs.tee``).

>>> minor_of("3.5.9"), minor_of("4.0.5"), minor_of("4.3.0.dev1")
((3, 5), (4, 0), (4, 3))
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

try:
    from pyspark.sql.streaming import StatefulProcessor
except ImportError:  # PySpark 3.5: the engines on transformWithState refuse to run there (require)
    class StatefulProcessor:  # type: ignore[no-redef]
        """What the tws and batched engines' processors derive from where PySpark has none."""

#: The first PySpark minor with each feature the engines use.
TRANSFORM_WITH_STATE_IN_PANDAS = (4, 0)
TRANSFORM_WITH_STATE_ROWS = (4, 1)
STATE_READERS = (4, 0)
OBSERVED_WITHOUT_INPUT = (4, 0)


def arrow_type(dt: Any) -> Any:
    """The Arrow type of the Spark type ``dt``, timestamps as UTC instants (PySpark 4.1 and later
    take ``timezone=``; 4.0 and 3.5 have none, their timestamps are always UTC)."""
    from pyspark.sql.pandas.types import to_arrow_type

    try:
        return to_arrow_type(dt, timezone="UTC")
    except TypeError:
        return to_arrow_type(dt)


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
