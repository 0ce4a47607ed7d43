"""What a user installing the package meets first: the version, `python -m sparkstate`, the help
texts (made from the settings' declarations), and a run that leaves nothing in the temp directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import sparkstate
from sparkstate.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _sparkstate(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkstate", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def test_version_is_the_package_metadata_one():
    done = _sparkstate("--version")
    assert done.returncode == 0
    assert done.stdout == f"sparkstate {metadata.version('sparkstate')}\n"
    assert sparkstate.__version__ == metadata.version("sparkstate")
    assert 'version = "' in (ROOT / "pyproject.toml").read_text()  # the one place it is written
    assert "__version__ = \"0." not in (ROOT / "src" / "sparkstate" / "__init__.py").read_text()


def _help(*words: str) -> str:
    parser = build_parser()
    for word in words:
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = sub.choices[word]
    return " ".join(parser.format_help().split())


def test_run_help_names_every_sink_and_describes_every_flag():
    text = _help("run")
    for form in ("console", "memory:NAME", "parquet:DIR", "json:DIR", "postgres:", "delta:PATH", "kafka:BROKERS/TOPIC"):
        assert form in text, form
    assert "--time-mode {event,processing} sessionize: the clock that times sessions out" in text
    assert "pip install 'sparkstate[connect]'" in text  # --remote


def test_every_argument_of_every_command_has_help():
    parser = build_parser()
    missing = []

    def walk(words, p):
        for a in p._actions:
            if a.__class__.__name__ == "_SubParsersAction":
                for name, child in a.choices.items():
                    walk(words + [name], child)
            elif not a.help and a.dest != "help":
                missing.append(f"sparkstate {' '.join(words)}: {a.dest}")

    walk([], parser)
    assert not missing, missing


def test_python_dash_m_sparkstate_runs_the_command():
    done = _sparkstate("demo", "--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: sparkstate demo")


def test_a_run_without_a_checkpoint_leaves_nothing_in_the_temp_directory(tmp_path):
    """Spark's log of a run without a local checkpoint is a temporary file, removed when the run ends well."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"word": "a"}\n{"word": "b"}\n')
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = _sparkstate("run", "running-count", "--source", f"files:{tmp_path / 'in'}", "--once", "--no-progress",
                       env={"TMPDIR": str(temp)}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "caught up" in done.stdout and "Spark's log" not in done.stdout
    assert sorted(p.name for p in temp.iterdir()) == []


def test_state_show_prints_the_state_and_keeps_spark_quiet(tmp_path):
    """`state show` starts Spark: its log lines go to a scratch file (removed at the end), the table to stdout."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"word": "a"}\n{"word": "a"}\n')
    ck = tmp_path / "ck"
    run = _sparkstate("run", "running-count", "--source", f"files:{tmp_path / 'in'}", "--sink", "memory",
                      "--deadletter", f"json:{tmp_path / 'dead'}", "--checkpoint", str(ck), "--once", "--no-progress",
                      cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = _sparkstate("state", "show", str(ck), "--json", env={"TMPDIR": str(temp)}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["value"] for line in done.stdout.splitlines()] == [2]
    assert "log4j" not in done.stderr and "WARN" not in done.stderr, done.stderr
    assert sorted(p.name for p in temp.iterdir()) == []
