"""Which sparkstate operator a checkpoint holds, and the engine that wrote its state.

Finds the checkpoint's stateful operators (Spark's ``state-metadata`` reader on PySpark 4.0 and
later; on 3.5, which has none, the checkpoint's ``state/<operator>/<partition>`` directories and
``commits/``) and asks every registered engine
(:meth:`~sparkstate.engines.base.Engine.stored_layout`) whether the operator's state is in its
layout; the one that answers reads it back. Nothing here knows an engine's layout.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from .. import fs
from ..errors import StateSchemaError
from ..paths import absolute_path
from .base import ENGINES, StoredLayout, get_engine
from .runtime import STATE_READERS, has

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


#: The checkpoint's file that keeps its query id (Spark's, ``{"id": "<uuid>"}``).
METADATA = "metadata"


def query_id_of(text: str) -> str:
    """The query id in the text of a checkpoint's :data:`METADATA` file."""
    return str(json.loads(text)["id"])


def stored_query_id(spark: "SparkSession | None", checkpoint: str | os.PathLike) -> str | None:
    """The query id ``checkpoint`` keeps, read through :mod:`sparkstate.fs` (``None``: no query
    started on it yet). Raises what :func:`sparkstate.fs.read_text` raises, and ``ValueError`` or
    ``KeyError`` for a file that names no id."""
    path = fs.join(checkpoint, METADATA)
    return query_id_of(fs.read_text(path, spark)) if fs.exists(path, spark) else None


def has_state(checkpoint: str | os.PathLike, spark: "SparkSession | None" = None) -> bool:
    """Whether a checkpoint directory holds committed state (at least one committed batch).

    On any filesystem Spark reaches (:mod:`sparkstate.fs`; ``spark``: the session whose Hadoop
    settings reach it, by default the active one).
    """
    root = absolute_path(checkpoint)
    return fs.is_dir(fs.join(root, "state"), spark) and any(n.isdigit() for n in fs.list_names(fs.join(root, "commits"), spark))


def operators(spark: "SparkSession", checkpoint: str | os.PathLike) -> list[dict[str, Any]]:
    """The stateful operators of a checkpoint: id, name, partitions, batches, time mode, variables.

    PySpark 3.5 records no operator metadata: there the name, time mode, output mode and state
    variables are ``None`` (the name is set by the engine that finds its layout there), the rest
    is read from the checkpoint's directories.
    """
    if not has(STATE_READERS):
        return _operators_from_directories(spark, absolute_path(checkpoint))
    # Spark 4.1 and 4.2's state reader reports to the driver's state store coordinator, which
    # Spark starts with the session's streaming query manager: in a process that has started no
    # query yet (a restarted `sparkstate run`, `sparkstate state`), reading fails with
    # CANNOT_LOAD_STATE_STORE unless the manager exists first.
    _ = spark.streams.active
    rows = spark.read.format("state-metadata").load(absolute_path(checkpoint)).collect()
    out = []
    for r in rows:
        props = json.loads(r.operatorProperties) if r.operatorProperties else {}
        out.append({
            "operator_id": r.operatorId,
            "operator": r.operatorName,
            "partitions": r.numPartitions,
            "min_batch_id": r.minBatchId,
            "max_batch_id": r.maxBatchId,
            "time_mode": props.get("timeMode"),
            "output_mode": props.get("outputMode"),
            "state_variables": [v.get("stateName") for v in props.get("stateVariables", [])],
        })
    return out


def _numbered(path: str, spark: "SparkSession") -> list[int]:
    return sorted(int(n) for n in fs.list_names(path, spark) if n.isdigit()) if fs.is_dir(path, spark) else []


def _operators_from_directories(spark: "SparkSession", root: str) -> list[dict[str, Any]]:
    """Spark 3.5's view: each ``state/<operator id>`` directory, its partitions' directories, and
    the committed batches (``commits/``)."""
    commits = _numbered(fs.join(root, "commits"), spark)
    out: list[dict[str, Any]] = []
    for op in _numbered(fs.join(root, "state"), spark):
        out.append({
            "operator_id": op,
            "operator": None,
            "partitions": len(_numbered(fs.join(root, "state", str(op)), spark)),
            "min_batch_id": commits[0] if commits else None,
            "max_batch_id": commits[-1] if commits else None,
            "time_mode": None,
            "output_mode": None,
            "state_variables": [],
        })
    return out


def _layout_of(spark: "SparkSession", checkpoint: str, op: dict[str, Any]) -> StoredLayout | None:
    for name in ENGINES:
        layout = get_engine(name).stored_layout(spark, checkpoint, op)
        if layout is not None:
            op.update(engine=layout.engine, layout=layout.version)
            layout.operator.update(engine=layout.engine, layout=layout.version)
            return layout
    return None


def written_by(spark: "SparkSession", checkpoint: str | os.PathLike | None) -> str | None:
    """The engine whose layout ``checkpoint``'s state has; ``None`` without a checkpoint or
    committed state, or for state this process cannot read (the query's own check of the
    checkpoint then says why)."""
    if checkpoint is None:
        return None
    try:
        return stored_layout(spark, checkpoint).engine if has_state(checkpoint, spark) else None
    except (StateSchemaError, fs.FsUnavailable):
        return None


def stored_layout(spark: "SparkSession", checkpoint: str | os.PathLike) -> StoredLayout:
    """The sparkstate state of ``checkpoint``, as the engine that wrote it reads it back.

    Raises :class:`StateSchemaError` when the checkpoint is missing, has no committed state,
    holds no sparkstate operator, or several.
    """
    checkpoint = absolute_path(checkpoint)
    if not fs.exists(checkpoint, spark):
        raise StateSchemaError(f"checkpoint {checkpoint} does not exist")
    if not has_state(checkpoint, spark):
        raise StateSchemaError(f"checkpoint {checkpoint} has no committed state yet (no batch has completed)")
    ops = operators(spark, checkpoint)
    ours = [layout for op in ops for layout in [_layout_of(spark, str(checkpoint), op)] if layout is not None]
    if not ops and not has(STATE_READERS):
        raise StateSchemaError(f"checkpoint {checkpoint} holds no stateful operator's state (its state/ directory"
                               " has no operator); point at the checkpoint of a query built with sparkstate")
    if not ops:
        raise StateSchemaError(
            f"checkpoint {checkpoint} has state but no operator metadata: Spark 3.5 wrote it. Run the query once on"
            " it with the engine that wrote it (engine='inband', PySpark 3.5's default) and without checkpoint=;"
            " Spark 4 then writes the metadata the state tools and the checkpoint= check read."
        )
    if not ours:
        found = "; ".join(f"{o['operator']} with state {', '.join(o['state_variables']) or '(none listed)'}"
                          if o["operator"] else f"a stateful operator (id {o['operator_id']}) not built with sparkstate"
                          for o in ops)
        raise StateSchemaError(
            f"checkpoint {checkpoint} does not hold sparkstate state: it has {found or 'no stateful operator'}."
            " Point at the checkpoint of a query built with sparkstate."
        )
    if len(ours) > 1:
        raise StateSchemaError(
            f"checkpoint {checkpoint} has {len(ours)} sparkstate operators; reading several is not supported yet"
        )
    return ours[0]
