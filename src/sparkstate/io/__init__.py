"""Sources and sinks around the pipelines. So far: the synthetic clickstream generator.

>>> from sparkstate.io import generate_events, reference_sessions
>>> len(reference_sessions(generate_events(20, users=2))) > 0
True
"""

from .generator import EVENT_SCHEMA, Event, Session, generate_events, read_events, reference_sessions, write_events

__all__ = ["EVENT_SCHEMA", "Event", "Session", "generate_events", "read_events", "reference_sessions", "write_events"]
