"""Ready-made pipelines on the keyed state operators (api.md section 4).

>>> from sparkstate.pipelines import sessionize
>>> callable(sessionize)
True
"""

from .sessionize import sessionize

__all__ = ["sessionize"]
