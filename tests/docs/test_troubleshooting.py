"""docs/troubleshooting.md names every error class, quotes sparkstate's messages as the code
writes them and Spark's as PySpark ships them (pure Python, no Spark)."""

from __future__ import annotations

import ast
import inspect
import re
import zipfile
from functools import lru_cache
from pathlib import Path

import sparkstate.errors as errors

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "troubleshooting.md"


def _error_classes() -> list[type]:
    return [c for _, c in inspect.getmembers(errors, inspect.isclass)
            if issubclass(c, errors.SparkStateError) and c.__module__ == errors.__name__]


def test_every_sparkstate_error_class_has_its_section():
    headings = set(re.findall(r"^### (\w+)\s*$", DOC.read_text(), re.M))
    classes = _error_classes()
    assert len(classes) >= 10
    missing = [c.__name__ for c in classes if c.__name__ not in headings]
    assert not missing, f"docs/troubleshooting.md has no section for {missing}"


def test_the_readme_links_it_from_its_map_of_the_docs():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    assert "(docs/troubleshooting.md)" in section


@lru_cache(maxsize=1)
def _source_strings() -> list[str]:
    """Every string literal of the package, implicit concatenations joined, an f-string's
    fields as NUL (so a quoted fragment never spans one)."""
    out = []
    for py in (ROOT / "src" / "sparkstate").rglob("*.py"):
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.JoinedStr):
                out.append("".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append(node.value)
    return out


def quoted_messages() -> list[str]:
    """The spans after "Message:" (and the "and `...`" ones that follow on the same item)."""
    out = []
    for item in re.split(r"\n- |\n\n", DOC.read_text()):
        if item.lstrip().startswith("Message:"):
            head = item.split("\n  ", 1)[0] if "\n  " in item else item
            out += re.findall(r"`([^`]+)`", head)
    return out


def test_sparkstate_messages_are_quoted_as_the_code_writes_them():
    strings = _source_strings()
    messages = quoted_messages()
    assert len(messages) >= 40
    wrong = []
    for message in messages:
        for fragment in (f.strip(" .") for f in message.split("…")):
            if len(fragment) >= 12 and not any(fragment in s for s in strings):
                wrong.append(f"{fragment!r} (in: {message})")
    assert not wrong, "quoted in docs/troubleshooting.md, but no sparkstate message says:\n" + "\n".join(wrong)


#: Spark's messages the page quotes (PySpark 4.3), each with where PySpark ships it: a jar and one
#: entry of it, or a file of the pyspark package.
SPARK_MESSAGES = {
    "Python worker failed to connect back": ("spark-core_", "org/apache/spark/api/python/PythonWorkerFactory.class"),
    "Timed out while waiting for the Python worker to connect back":
        ("spark-core_", "org/apache/spark/api/python/PythonWorkerFactory.class"),
    "State store encoding format as avro is not supported for operator":
        ("spark-catalyst_", "org/apache/spark/sql/catalyst/analysis/UnsupportedOperationChecker$.class"),
    "Failed to find the data source": ("spark-common-utils_", "error/error-conditions.json"),
    "This query does not support recovering from checkpoint location":
        ("spark-common-utils_", "error/error-conditions.json"),
    "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION": ("spark-common-utils_", "error/error-conditions.json"),
    "STREAMING_PYTHON_RUNNER_INITIALIZATION_FAILURE": ("spark-common-utils_", "error/error-conditions.json"),
    "CANNOT_WRITE_STATE_STORE": ("spark-common-utils_", "error/error-conditions.json"),
    "CANNOT_COMMIT": ("spark-common-utils_", "error/error-conditions.json"),
    "PATH_NOT_FOUND": ("spark-common-utils_", "error/error-conditions.json"),
    "CONTEXT_ONLY_VALID_ON_DRIVER": (None, "errors/error-conditions.json"),
    "does not yet fully support pandas >= 3.0.0": (None, "*.py"),
}


def test_sparks_messages_are_quoted_as_pyspark_ships_them():
    import pyspark

    text = DOC.read_text()
    home = Path(pyspark.__file__).parent
    wrong = []
    for message, (jar, entry) in SPARK_MESSAGES.items():
        assert message in text, message
        if jar is None:
            found = any(message in f.read_text(errors="replace") for f in home.rglob(entry))
        else:
            [path] = (home / "jars").glob(jar + "*.jar")
            with zipfile.ZipFile(path) as z:
                found = message.encode() in z.read(entry)
        if not found:
            wrong.append(message)
    assert not wrong, f"not where PySpark {pyspark.__version__} ships them: {wrong}"
