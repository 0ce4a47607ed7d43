"""The exceptions sparkstate raises.

Every error derives from :class:`SparkStateError`, except where the public contract names a
built-in type (``ValueError`` for bad arguments, ``LookupError`` for missing state). Messages
say where the problem is, what was expected, what arrived, and how to fix it.
"""

from __future__ import annotations

import re


class SparkStateError(Exception):
    """Base class of every sparkstate error."""


class TimeoutConfigError(SparkStateError):
    """A timeout was used in a way the query's timeout configuration does not allow."""


class StateNotFoundError(SparkStateError, LookupError):
    """``GroupState.get`` was called for a key that has no state."""


class StateTypeError(SparkStateError, TypeError):
    """A state, value or output type cannot be encoded, or a value does not match its type."""


class StateSchemaError(SparkStateError):
    """The state stored in a checkpoint is incompatible with the state type of the query."""


class UserFunctionError(SparkStateError):
    """The user's function raised; the message names the key and the original exception."""


class WorkerImportError(SparkStateError):
    """The Python workers cannot import a module the query's function or types need (raised on a
    worker; the message names the module and the fixes). See :mod:`sparkstate.shipping`."""


class ConfigError(SparkStateError, ValueError):
    """A query was defined with arguments that cannot work together."""


class SinkError(SparkStateError):
    """A sink could not be set up or could not write a micro-batch (connection, table, permissions).

    Messages never contain a password: connection URLs in them are masked.
    """


class JobFailedError(SparkStateError):
    """A query of a running job (``sparkstate run``, :func:`sparkstate.jobs.run_pipeline`) stopped
    with an error; the message has the query's role and Spark's first line."""


# --- one readable line for an error that comes back from Spark -------------------------------

_OUR_ERROR = re.compile(r"^\s*sparkstate\.errors\.(\w+): (.+)$")
_PY_ERROR = re.compile(r"^\s*((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)): (.+)$")
# Wrappers around the real error: Spark's and py4j's own exception types.
_WRAPPERS = ("py4j.", "pyspark.", "org.apache.", "java.", "scala.")
_QUERY_PREFIX = re.compile(r"^\[STREAM_FAILED\] Query \[[^\]]*\] terminated with exception: ")
_MAX_CHARS = 600
# py4j's first line when the JVM answered a call with an error of its own; its trace follows.
_PY4J_TRACE = re.compile(r"\.\s*Trace:$")


def from_spark(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by PySpark or py4j (Spark refused something, or a call into its JVM
    failed) rather than by sparkstate or the user's code.

    >>> from py4j.protocol import Py4JError
    >>> from_spark(Py4JError("An error occurred while calling o1.json")), from_spark(ValueError("x"))
    (True, False)
    """
    return type(exc).__module__.startswith(("pyspark.", "py4j."))


def explain(exc: BaseException | str) -> str:
    """One readable line for an error that came back from Spark, without stack traces.

    A failed streaming query's exception holds Spark's message, the Python traceback of the
    worker that failed and the JVM stack trace, often several times over. This picks what a
    person needs: a sparkstate error raised on a worker (for a state function that raised:
    ``UserFunctionError: the state function 'f' raised ValueError: ... (key 'u1') ...``), else
    the last Python exception of the embedded traceback, else Spark's first line (without the
    ``[STREAM_FAILED] Query [id = ...] terminated with exception:`` preamble).

    >>> explain("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: [X] it broke\\n\\tat a.b(C.java:1)")
    '[X] it broke'
    >>> explain("PythonException: from the worker:\\nTraceback (most recent call last):\\n  File ...\\n"
    ...         "ValueError: boom\\n\\nsparkstate.errors.UserFunctionError: the state function 'f' raised"
    ...         " ValueError: boom (key 'u1')\\n\\tat py4j.Protocol(Protocol.java:476)")
    "UserFunctionError: the state function 'f' raised ValueError: boom (key 'u1')"
    >>> explain("An error occurred while calling o12.isActive. Trace:\\npy4j.Py4JException: Target Object ID ...")
    'An error occurred while calling o12.isActive'
    """
    text = str(exc).strip() if not isinstance(exc, str) else exc.strip()
    if not text:
        return type(exc).__name__ if not isinstance(exc, str) else "unknown error"
    lines = text.splitlines()
    ours = [m for m in map(_OUR_ERROR.match, lines) if m]
    if ours:
        found = f"{ours[-1].group(1)}: {ours[-1].group(2).strip()}"
    else:
        python = [m for m in map(_PY_ERROR.match, lines) if m and not m.group(1).startswith(_WRAPPERS)]
        if python and "Traceback (most recent call last)" in text:
            found = f"{python[-1].group(1).rsplit('.', 1)[-1]}: {python[-1].group(2).strip()}"
        else:
            found = _PY4J_TRACE.sub("", _QUERY_PREFIX.sub("", lines[0].strip()))
    return found if len(found) <= _MAX_CHARS else found[: _MAX_CHARS - 3] + "..."
