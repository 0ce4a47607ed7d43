"""How a user's state function and types reach the Python workers.

PySpark ships a function to its workers with cloudpickle, which pickles a function or class *by
reference* (module name and attribute) when its module is importable on the driver, and only
``__main__`` by value. A state function defined in a pytest test module, in a module beside the
user's script, or in any folder put on ``sys.path`` at run time is then imported again on each
worker, where that folder is not on the path: ``ModuleNotFoundError`` on the worker.

So before a query is handed to Spark (:func:`ship_user_modules`, called once per query by the
operators), every loaded module that is *not installed* is registered with cloudpickle to travel
by value: its functions and classes used by the query are pickled with the query (in local mode
and on a cluster alike). Installed means: the standard library, a module under one of the
interpreter's library or site-packages folders, or a top-level package of an installed
distribution (editable installs included). ``sparkstate`` and ``pyspark`` always travel by
reference.

What still travels by reference (an installed package, a module imported inside the function
body at call time) must be importable on the workers. When it is not, the plan's unpickling on the
worker (:func:`load_plan`) raises :class:`~sparkstate.errors.WorkerImportError`: one line naming
the module and the fixes, which :func:`sparkstate.errors.explain` picks out of Spark's error.
"""

from __future__ import annotations

import importlib.machinery
import os
import pickle
import site
import sys
import sysconfig
from typing import Any

from .errors import WorkerImportError

#: Top-level packages that always travel by reference (the workers must have them anyway).
ALWAYS_BY_REFERENCE = frozenset({"sparkstate", "pyspark", "py4j", "__main__", "__mp_main__", "builtins"})

_decided: dict[str, bool] = {}  # module name -> shipped by value
_roots: tuple[str, ...] | None = None
_distributions: frozenset[str] | None = None


def _install_roots() -> tuple[str, ...]:
    """The interpreter's library and site-packages folders (realpaths, ending with a separator)."""
    global _roots
    if _roots is None:
        dirs: set[str] = set()
        for scheme_vars in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
            paths = sysconfig.get_paths(vars=scheme_vars) if scheme_vars else sysconfig.get_paths()
            dirs.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k))
        try:
            dirs.update(site.getsitepackages())
        except AttributeError:  # pragma: no cover - old virtualenvs
            pass
        user = getattr(site, "getusersitepackages", lambda: None)()
        if user:
            dirs.add(user)
        _roots = tuple(os.path.join(os.path.realpath(d), "") for d in dirs)
    return _roots


def _distribution_packages() -> frozenset[str]:
    """Top-level names of installed distributions (read once: it scans every installed package)."""
    global _distributions
    if _distributions is None:
        from importlib.metadata import packages_distributions

        try:
            _distributions = frozenset(packages_distributions())
        except Exception:  # a broken distribution's metadata: treat nothing as installed by name
            _distributions = frozenset()
    return _distributions


def _origin(module: Any) -> str | None:
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None) or getattr(module, "__file__", None)
    if not isinstance(origin, str) or origin in ("built-in", "frozen"):
        return None
    return origin


def ships_by_value(name: str, module: Any) -> bool:
    """Whether module ``name`` travels by value with a query (it is not installed)."""
    top = name.partition(".")[0]
    if top in ALWAYS_BY_REFERENCE or top in sys.stdlib_module_names or top.startswith("_pytest"):
        return False
    origin = _origin(module)
    if origin is None or not origin.endswith(tuple(importlib.machinery.SOURCE_SUFFIXES + importlib.machinery.BYTECODE_SUFFIXES)):
        return False  # built-in, frozen, namespace-only or a compiled extension: cannot travel by value
    if os.path.realpath(origin).startswith(_install_roots()):
        return False
    return top not in _distribution_packages()


def ship_user_modules() -> list[str]:
    """Register every loaded module that is not installed to be pickled by value; return the
    names registered by this call. Cheap after the first call (each module is looked at once)."""
    from pyspark import cloudpickle

    added = []
    for name, module in list(sys.modules.items()):
        if name in _decided or module is None:
            continue
        by_value = ships_by_value(name, module)
        _decided[name] = by_value
        if by_value:
            try:
                cloudpickle.register_pickle_by_value(module)
            except ValueError:  # not in sys.modules any more, or not a module
                _decided[name] = False
                continue
            added.append(name)
    return added


def dump_plan(values: tuple) -> bytes:
    """A plan's fields as one blob, for :func:`load_plan` to unpickle on the worker."""
    from pyspark import cloudpickle

    return cloudpickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)


def load_plan(blob: bytes, what: str) -> tuple:
    """Unpickle :func:`dump_plan`'s blob, turning a module the worker cannot import into one
    readable error (``what``: the function and operator that need it)."""
    try:
        return pickle.loads(blob)
    except ModuleNotFoundError as exc:
        raise WorkerImportError(worker_import_message(exc.name or str(exc), what)) from None
    except AttributeError as exc:  # the worker's copy of a module lacks the function or class
        obj = getattr(exc, "obj", None)
        module = getattr(obj, "__name__", None)
        if module is None:
            raise
        raise WorkerImportError(
            f"the Python workers' copy of module {module!r} has no {exc.name!r} (needed by {what}): the workers run"
            " another version of it. Install the same version on the workers, or ship it with --py-files."
        ) from None


def worker_import_message(module: str, what: str) -> str:
    """The one line for a module the workers cannot import."""
    return (
        f"the Python workers cannot import module {module!r} (needed by {what}); it is installed where the driver"
        " runs but not on the workers. Install it on the workers, ship it with spark-submit --py-files"
        " (spark.submit.pyFiles), or define the function in the main script."
    )
