"""The engine seam: what an operator hands an engine, and what it gets back.

An operator compiles the user's function and types into a :class:`StatePlan` (everything
here is picklable and holds no DataFrame or session); an engine turns the input DataFrame and
the plan into the output DataFrame. A new engine registers itself in :data:`ENGINES` and needs
no change to operators or pipelines.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable

from ..errors import ConfigError
from ..group_state import GroupFunc, GroupStateTimeout
from ..types import Codec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

#: Meta columns stored beside the state's own fields in the state row.
EXISTS_COLUMN = "_sparkstate_exists"
TIMEOUT_COLUMN = "_sparkstate_timeout_ms"
RESERVED_PREFIX = "_sparkstate_"
#: Name of the state variable in the state store (what ``format("statestore")`` reads).
STATE_VARIABLE = "sparkstate"
#: Column of an initial-state DataFrame (and of ``ss.state.read``) holding a pending timeout.
INITIAL_TIMEOUT_COLUMN = "timeout_ms"


@dataclass(frozen=True)
class StatePlan:
    """A keyed stateful computation, ready for an engine.

    ``func`` is called as ``func(key, values, state)`` once per key and micro-batch (and once
    per timeout); its result is one output or ``None`` (``flat=False``), or an iterable of
    outputs (``flat=True``). Outputs go through ``output_encoder`` into ``output_schema``.
    """

    operator: str
    key_columns: tuple[str, ...]
    func: GroupFunc
    flat: bool
    state_codec: Codec
    output_schema: "StructType"
    output_encoder: Callable[[Any], Any]
    timeout: GroupStateTimeout
    keep_expired_state: bool
    state_ttl_ms: int | None
    value_decoder: Callable[[Any], Any] | None
    output_mode: str
    has_watermark: bool
    streaming: bool
    initial_has_timeout: bool = False
    #: Keys loaded from the initial state without a ``timeout_ms`` time out this long after the
    #: first batch (``map_with_state`` with ``StateSpec.timeout``: they are idle from the start).
    initial_idle_timeout_ms: int | None = None

    def __reduce__(self) -> tuple:
        # On its way to a worker the plan is one blob unpickled by sparkstate's own code, so a
        # module the worker cannot import (the user's function's, or its types') becomes one
        # readable error naming it (sparkstate.shipping.load_plan), not a bare ModuleNotFoundError.
        from ..shipping import dump_plan

        what = f"the state function {getattr(self.func, '__name__', self.func)!r} of {self.operator}"
        return _plan_from, (dump_plan(tuple(getattr(self, f.name) for f in fields(self))), what)


def _plan_from(blob: bytes, what: str) -> StatePlan:
    from ..shipping import load_plan

    return StatePlan(*load_plan(blob, what))


class Engine(abc.ABC):
    """Runs a :class:`StatePlan` on a DataFrame."""

    name: str = ""

    @abc.abstractmethod
    def apply(self, df: "DataFrame", plan: StatePlan, initial_state: "DataFrame | None") -> "DataFrame":
        """Return the output DataFrame of ``plan`` applied to ``df``.

        ``initial_state``, when given, has the key columns (typed as in ``df``, named
        :func:`initial_key_column`), then the
        state's columns (``plan.state_codec.columns``), then ``timeout_ms`` when
        ``plan.initial_has_timeout``.
        """


def initial_key_column(i: int) -> str:
    """Name of the i-th key column in the initial-state layout handed to engines."""
    return f"{RESERVED_PREFIX}key_{i}"


ENGINES: dict[str, Callable[[], Engine]] = {}


def register_engine(name: str, factory: Callable[[], Engine]) -> None:
    ENGINES[name] = factory


def get_engine(name: str | Engine) -> Engine:
    if isinstance(name, Engine):
        return name
    if name not in ENGINES:
        raise ConfigError(f"engine: expected one of {', '.join(sorted(ENGINES))}, got {name!r}")
    return ENGINES[name]()


#: The column metadata key by which Spark finds the event-time watermark of a plan.
WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"


def has_watermark(df: "DataFrame") -> bool:
    """Whether a column of ``df`` carries an event-time watermark (``withWatermark`` upstream):
    then Spark drops the rows behind it inside the stateful operator reading ``df``."""
    return any(WATERMARK_DELAY_KEY in (f.metadata or {}) for f in df.schema.fields)
