"""Sources and sinks around the pipelines: the synthetic clickstream, sources with dead letters.

>>> from sparkstate.io import generate_events, reference_sessions
>>> len(reference_sessions(generate_events(20, users=2))) > 0
True
>>> from sparkstate.io import parse_source
>>> parse_source("files:/data/in").kind
'files'
"""

from .generator import (
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
