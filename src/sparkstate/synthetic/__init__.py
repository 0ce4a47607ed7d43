"""The synthetic clickstream: seeded events, their reference sessions, and ways to serve them.

Test and demo data, not I/O: :mod:`~sparkstate.synthetic.generator` (events, JSON-lines files),
:mod:`~sparkstate.synthetic.reference` (the sessions in them: the ground truth),
:mod:`~sparkstate.synthetic.stream` (the endless stream with late and malformed records),
:mod:`~sparkstate.synthetic.generator_source` (that stream as a Spark source, ``generator``
specs) and :mod:`~sparkstate.synthetic.line_server` (lines over TCP, ``socket:`` specs).

>>> from sparkstate.synthetic import generate_events, reference_sessions
>>> len(reference_sessions(generate_events(20, users=2))) > 0
True
"""

from .generator import EVENT_SCHEMA, Event, Session, generate_events, read_events, write_events
from .reference import reference_sessions
from .stream import Record, StreamConfig, iter_records, serve_events, stream_records

__all__ = [
    "EVENT_SCHEMA",
    "Event",
    "Record",
    "Session",
    "StreamConfig",
    "generate_events",
    "iter_records",
    "read_events",
    "reference_sessions",
    "serve_events",
    "stream_records",
    "write_events",
]
