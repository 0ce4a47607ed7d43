"""Ready-made pipelines on the keyed state operators (docs/api.md, ``sparkstate.pipelines``).

Each validates its input when it is defined (missing columns, wrong types: a ``ConfigError``
that names them) and returns the output DataFrame, streaming if the input streams.

>>> from sparkstate.pipelines import first_last_activity, running_count, sessionize, visited_pages
>>> all(map(callable, (first_last_activity, running_count, sessionize, visited_pages)))
True
"""

from .first_last_activity import first_last_activity
from .running_count import running_count
from .session_windows import sessions_per_window
from .sessionize import sessionize
from .visited_pages import visited_pages

__all__ = ["first_last_activity", "running_count", "sessions_per_window", "sessionize", "visited_pages"]
