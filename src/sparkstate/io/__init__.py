"""Sources and sinks around the pipelines: sources with dead letters, sinks written exactly once.

The synthetic clickstream is :mod:`sparkstate.synthetic`; its names are re-exported here too.

>>> from sparkstate.io import generate_events, reference_sessions
>>> len(reference_sessions(generate_events(20, users=2))) > 0
True
>>> from sparkstate.io import parse_source
>>> parse_source("files:/data/in").kind
'files'
"""

# The synthetic clickstream lives in sparkstate.synthetic; its names stay importable from here.
from ..synthetic import (
    EVENT_SCHEMA,
    Event,
    Record,
    Session,
    StreamConfig,
    generate_events,
    iter_records,
    read_events,
    reference_sessions,
    serve_events,
    stream_records,
    write_events,
)
from .parse import DEAD_LETTER_SCHEMA, Parsed, parse_csv, parse_json
from .sources import Source, SourceSpec, open_source, parse_source

__all__ = [
    "DEAD_LETTER_SCHEMA",
    "EVENT_SCHEMA",
    "Event",
    "Parsed",
    "Record",
    "Session",
    "Source",
    "SourceSpec",
    "StreamConfig",
    "generate_events",
    "iter_records",
    "open_source",
    "parse_csv",
    "parse_json",
    "parse_source",
    "read_events",
    "reference_sessions",
    "serve_events",
    "stream_records",
    "write_events",
]
