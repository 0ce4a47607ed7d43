"""The optional parts of sparkstate (``pip install 'sparkstate[EXTRA]'``) and what each needs.

Each extra of ``pyproject.toml`` that a feature needs at run time is named here with the modules
it brings, so that a missing one is found before Spark starts (:func:`require`), with the exact
command that installs it. Nothing is imported to check: :func:`importlib.util.find_spec` only looks.

>>> require("report", "sparkstate report") is None or True
True
>>> install_hint("delta")
"pip install 'sparkstate[delta]'"
"""

from __future__ import annotations

from importlib.util import find_spec

from .errors import ConfigError

#: extra -> (the package a user knows it by, the modules it must make importable)
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "connect": ("the Spark Connect client (pyspark[connect]: grpcio, grpcio-status, googleapis-common-protos,"
                " zstandard)", ("grpc", "grpc_status", "google.rpc", "zstandard")),
    "delta": ("the deltalake package", ("deltalake",)),
    "postgres": ("psycopg", ("psycopg",)),
    "report": ("matplotlib", ("matplotlib",)),
    "kafka": ("confluent-kafka", ("confluent_kafka",)),
    "config": ("PyYAML", ("yaml",)),
}


def install_hint(extra: str) -> str:
    """The command that installs ``extra``."""
    return f"pip install 'sparkstate[{extra}]'"


def _importable(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing (google.rpc without google)
        return False


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (empty: it is installed)."""
    return [m for m in EXTRAS[extra][1] if not _importable(m)]


def require(extra: str, what: str) -> None:
    """Raise :class:`~sparkstate.errors.ConfigError` saying how to install ``extra`` when it is missing.

    ``what`` names what needs it, e.g. ``"run: the delta: sink"``.
    """
    if missing(extra):
        raise ConfigError(f"{what} needs {EXTRAS[extra][0]}: {install_hint(extra)}")


__all__ = ["EXTRAS", "install_hint", "missing", "require"]
