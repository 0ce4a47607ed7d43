"""The exceptions sparkstate raises.

Every error derives from :class:`SparkStateError`, except where the public contract names a
built-in type (``ValueError`` for bad arguments, ``LookupError`` for missing state). Messages
say where the problem is, what was expected, what arrived, and how to fix it.
"""

from __future__ import annotations


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


class ConfigError(SparkStateError, ValueError):
    """A query was defined with arguments that cannot work together."""


class SinkError(SparkStateError):
    """A sink could not be set up or could not write a micro-batch (connection, table, permissions).

    Messages never contain a password: connection URLs in them are masked.
    """


class JobFailedError(SparkStateError):
    """A query of a running job (``sparkstate run``, :func:`sparkstate.jobs.run_pipeline`) stopped
    with an error; the message has the query's role and Spark's first line."""
