"""The docs agree with the code: every `sparkstate ...` flag, stated default, repository file,
relative link and `make` target named in README.md and docs/*.md exists (pure Python, no Spark)."""

from __future__ import annotations

import argparse
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: The dated records (docs/bench/*.md): measured runs kept as they were written, so their flags and
#: defaults are those of their day; only their links and the figures the guides take from them are checked.
RECORDS = sorted((ROOT / "docs" / "bench").glob("*.md"))
PACKAGE = ROOT / "src" / "sparkstate"


def _rel(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


def _code(text: str) -> list[str]:
    """Every code span and fenced block of a markdown text, one string per line of code."""
    fenced = [b.replace("\\\n", " ") for b in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)]
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    spans = re.findall(r"``?([^`]+)``?", prose)
    return [line for block in fenced for line in block.splitlines()] + spans


# --- the parser ------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def commands() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every (sub)command of ``sparkstate``, by its words: () is the top level."""
    from sparkstate.cli import build_parser

    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(words: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        found[words] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(words + (name,), child)

    walk((), build_parser())
    return found


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {opt: a for a in parser._actions for opt in a.option_strings}


def _command_of(words: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """The longest known command at the start of ``words``, and the words after it."""
    known = commands()
    n = 0
    while n < len(words) and tuple(words[: n + 1]) in known:
        n += 1
    return tuple(words[:n]), words[n:]


def cli_mentions() -> list[tuple[str, str, tuple[str, ...], str]]:
    """(doc, the mention, command, flag) for each flag of a `sparkstate ...` mention in the docs."""
    out = []
    for doc in DOCS:
        for code in _code(doc.read_text()):
            for m in re.finditer(r"(?:^|[\s;&|(`$])sparkstate((?:\s+[^\s;&|)`]+)*)", code):
                words = m.group(1).split()
                command, rest = _command_of(words)
                if not command:  # "sparkstate" as a package name, not a command line
                    continue
                for word in rest:
                    if word.startswith("--"):
                        out.append((_rel(doc), m.group(0).strip(), command, word.split("=", 1)[0]))
    return out


def test_the_docs_name_sparkstate_command_lines():
    """The check below has something to check (a regex that stopped matching would pass it)."""
    assert len({(c, f) for _, _, c, f in cli_mentions()}) >= 15


def test_every_flag_of_a_sparkstate_command_line_in_the_docs_exists():
    wrong = []
    for doc, mention, command, flag in cli_mentions():
        # "sparkstate state ... --remote": the flag of every subcommand of `state`
        scope = [p for words, p in commands().items() if words[: len(command)] == command]
        if "..." in mention.split():
            scope = [p for words, p in commands().items() if words[: len(command)] == command and words != command]
        if not all(flag in _flags(p) for p in scope) and flag not in _flags(commands()[()]):
            wrong.append(f"{doc}: `sparkstate {' '.join(command)}` has no {flag} (in: {mention})")
    assert not wrong, "\n".join(wrong)


#: spark-submit's own flags, which the docs name next to ours.
SPARK_SUBMIT_FLAGS = {"--conf", "--py-files", "--archives", "--packages", "--jars", "--master", "--deploy-mode"}


def _benchmark_flags() -> set[str]:
    """The flags the benchmark scripts' argument parsers define."""
    return {f for py in (ROOT / "benchmarks").glob("*.py")
            for f in re.findall(r"add_argument\(\s*\"(--[a-z][a-z0-9-]*)\"", py.read_text())}


def test_every_flag_named_on_its_own_in_the_docs_exists_somewhere():
    """A code span starting with a flag (`--once`, `--steady`) in prose is a flag of sparkstate,
    of a benchmark script or of spark-submit."""
    known = set(_all_flags()) | _benchmark_flags() | SPARK_SUBMIT_FLAGS
    wrong, checked = [], 0
    for doc in DOCS:
        prose = re.sub(r"^```[^\n]*\n.*?^```", "", doc.read_text(), flags=re.S | re.M)
        for span in re.findall(r"`([^`]+)`", prose):
            m = re.match(r"(--[a-z][a-z0-9-]*)", span)
            if m:
                checked += 1
                if m.group(1) not in known:
                    wrong.append(f"{_rel(doc)}: `{span}`: no such flag")
    assert checked >= 30
    assert not wrong, "\n".join(wrong)


def _all_flags() -> dict[str, list[argparse.Action]]:
    out: dict[str, list[argparse.Action]] = {}
    for parser in commands().values():
        for flag, action in _flags(parser).items():
            out.setdefault(flag, []).append(action)
    return out


def _default_of(action: argparse.Action) -> str | None:
    """The default a flag's help states ("default: X"), else argparse's own default."""
    m = re.search(r"default:\s*([^;)]+)", action.help or "")
    if m:
        return m.group(1).strip()
    return None if action.default in (None, argparse.SUPPRESS) else str(action.default)


def _same_value(doc_value: str, code_value: str) -> bool:
    from sparkstate.durations import to_ms

    def norm(v: str) -> str:
        return re.sub(r"(?<=\d),(?=\d{3})", "", v.strip().strip("`'\".").lower())

    a, b = norm(doc_value), norm(code_value)
    if a == b or re.match(re.escape(a) + r"\b(?![.,]\d)", b):  # "json" of "json, or what ... holds"
        return True
    try:
        return to_ms(a.replace(" s", " seconds") if a.endswith(" s") else a) == to_ms(b)
    except Exception:
        return False


_STATED_DEFAULTS = (
    # "`--flag` ..., default: X" / "(`--flag`, default X)" / "(`--flag`, X by default"
    re.compile(r"`(--[a-z][a-z0-9-]*)`[^.;`]*?,?\s*\(?(?:default[: ]\s*`?([\w.,:/ -]+?)`?[;,)]"
               r"|`?([\w.,]+(?: [a-z]+)?)`? by default)"),
    # "`--flag X`, the default"
    re.compile(r"`(--[a-z][a-z0-9-]*) ([\w.:-]+)`, the default"),
    # a number right after the flag: "`--max-batch-files` (100)", "`--max-batch-files`, 100, for files"
    re.compile(r"`(--[a-z][a-z0-9-]*)`,? \(?(\d{1,3}(?:,\d{3})*(?:\.\d+)?)(?!,?\d)(?:[;,)]| for\b)"),
)


def stated_defaults() -> list[tuple[str, str, str]]:
    """(doc, flag, the default the doc states for it)."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for pattern in _STATED_DEFAULTS:
            for m in pattern.finditer(text):
                value = next(g for g in m.groups()[1:] if g)
                out.append((_rel(doc), m.group(1), value.strip()))
    return out


def test_every_default_stated_for_a_sparkstate_flag_matches_the_code():
    flags = _all_flags()
    checked, wrong = 0, []
    for doc, flag, value in stated_defaults():
        if flag not in flags:  # another tool's flag (spark-submit, benchmarks): not ours to check
            continue
        defaults = [d for d in map(_default_of, flags[flag]) if d is not None]
        if not defaults:
            continue
        checked += 1
        if not any(_same_value(value, d) for d in defaults):
            wrong.append(f"{doc}: {flag} is said to default to {value!r}; the code says {defaults}")
    assert not wrong, "\n".join(wrong)
    assert checked >= 7  # the stated defaults the docs hold today (--trigger has none: it depends on the job)


# --- files, links and make targets -----------------------------------------------------------

_PATH = re.compile(r"(?<![\w./:-])((?:\.?[\w-]+/)*[\w-]+\.(?:py|md|toml|yml|yaml|cfg|ini|sh|txt|json|png|csv))"
                   r"(?![\w/])")
_DIR = re.compile(r"^(?:src|tests|benchmarks|docs|\.ci)/[\w./-]*$")


#: Directories the docs name that a run creates (each checked against the code that writes it).
GENERATED = {"benchmarks/results/": ROOT / "benchmarks" / "months.py"}


def _exists(name: str, doc: Path) -> bool:
    """Whether a file (or `file.py:function`, `test.py::test`) the docs name is in the repo."""
    if name in GENERATED:
        return name.rstrip("/") in GENERATED[name].read_text()
    path, _, attr = name.replace("::", ":").partition(":")
    for base in (ROOT, doc.parent, PACKAGE, ROOT / "src"):
        found = base / path.rstrip("/")
        if found.exists():
            return not attr or re.search(rf"^\s*(?:def|class|async def) {re.escape(attr)}\b|^{re.escape(attr)}\s*[:=]",
                                         found.read_text(), re.M) is not None
    return False


def _placeholder(word: str) -> bool:
    """A path standing for the user's (CK/_sparkstate_job.json, OUT/spark.log, months-STAMP, *.py)."""
    if re.search(r"[*$<{]", word):
        return True
    words = re.findall(r"[A-Z]{2,}", word)
    return any(w not in ("README", "CHANGELOG", "LICENSE") for w in words)


def file_mentions() -> list[tuple[Path, str]]:
    """Repository files named in code spans: `path/to/file.py` (placeholders in CAPITALS aside)."""
    out = []
    for doc in DOCS:
        for code in _code(doc.read_text()):
            for word in code.split():
                word = word.strip("(),;'\"")
                if _DIR.match(word) or ("/" in word and _PATH.fullmatch(word.split(":")[0])):
                    if _placeholder(word) or word.startswith(("s3a:", "http")):
                        continue  # CHECKPOINT/spark.log, dirs/*.py, $VAR/...: not a file of the repo
                    out.append((doc, word))
    return out


def test_every_repository_file_named_in_the_docs_exists():
    mentions = file_mentions()
    assert len(mentions) >= 30
    missing = sorted({f"{_rel(doc)}: {name}" for doc, name in mentions if not _exists(name, doc)})
    assert not missing, "\n".join(missing)


def _anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file."""
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
    out = set()
    for title in re.findall(r"^#+\s+(.+?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", title.lower().replace("`", "")).replace(" ", "-")
        base, n = slug, 1
        while slug in out:
            slug, n = f"{base}-{n}", n + 1
        out.add(slug)
    return out


def test_every_relative_link_in_the_docs_leads_somewhere():
    wrong, checked = [], 0
    for doc in [*DOCS, *RECORDS, ROOT / "CHANGELOG.md"]:
        text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            checked += 1
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                wrong.append(f"{_rel(doc)}: link to {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                wrong.append(f"{_rel(doc)}: link to {target}: no such heading in {dest.name}")
    assert checked >= 20
    assert not wrong, "\n".join(wrong)


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def test_every_make_target_named_in_the_docs_exists():
    named = [(doc, m) for doc in DOCS for code in _code(doc.read_text())
             for m in re.findall(r"(?:^|[\s;&|(])make ([a-z][\w-]*)", code)]
    assert len(named) >= 3
    missing = [f"{_rel(doc)}: make {t}" for doc, t in named if t not in make_targets()]
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("text, ok", [("`sparkstate run --nope`", False), ("`sparkstate run --once`", True)])
def test_the_flag_check_catches_a_wrong_flag(text, ok):
    """The flag extraction on a made-up doc line (so that the check above can fail)."""
    [code] = _code(text)
    m = re.search(r"sparkstate((?:\s+[^\s;&|)`]+)*)", code)
    command, rest = _command_of(m.group(1).split())
    assert command == ("run",)
    assert (rest[0] in _flags(commands()[command])) is ok


# --- figures: stated once (performance.md, "Figures at a glance"), never contradicted ---------

_RATIO = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)x\b")
_RATE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)K(?: events/s|\b)")


def _figures(text: str) -> set[str]:
    """Speed ratios (0.54x) and throughputs (179.7K events/s) in a text, ranges split ("3.7x to
    14x", "28.0-29.9K")."""
    text = re.sub(r"(\d+(?:\.\d+)?)-(?=\d+(?:\.\d+)?(K|x)\b)", r"\1\2 ", text)  # 28.0-29.9K -> 28.0K 29.9K
    text = re.sub(r"(\d+(?:\.\d+)?) to (?=\d+(?:\.\d+)?x\b)", r"\1x ", text)  # 4 to 14x -> 4x 14x
    return {m + "x" for m in _RATIO.findall(text)} | {m + "K" for m in _RATE.findall(text)}


def test_speed_figures_outside_performance_md_are_those_of_its_table():
    """README and the guides quote speed ratios and events/s only as "Figures at a glance" states
    them (reliability.md and performance.md hold the runs themselves)."""
    perf = (ROOT / "docs" / "performance.md").read_text()
    glance = perf.split("## Figures at a glance", 1)[1].split("\n## ", 1)[0]
    stated = _figures(glance)
    assert {"0.54x", "14x", "179.7K", "331.0K"} <= stated
    wrong = []
    for doc in DOCS:
        if doc.name in ("performance.md", "reliability.md"):
            continue
        prose = re.sub(r"^```[^\n]*\n.*?^```", "", doc.read_text(), flags=re.S | re.M)
        for line in prose.splitlines():
            if re.search(r"events/s|[Jj]ava|PySpark|faster|slower|speed", line):
                for figure in sorted(_figures(line) - stated):
                    wrong.append(f"{_rel(doc)}: {figure} is not in performance.md's Figures at a glance: {line.strip()}")
    assert not wrong, "\n".join(wrong)


def _glance() -> str:
    perf = (ROOT / "docs" / "performance.md").read_text()
    return perf.split("## Figures at a glance", 1)[1].split("\n## ", 1)[0]


def _record_figures(text: str) -> set[str]:
    """The figures of a dated record: its ratios and throughputs, and the bare numbers of its
    tables' ratio columns ("| 0.53 |" under "x Java") read as ratios."""
    cells = re.findall(r"(?<=\|) *(\d+\.\d+(?:-\d+\.\d+)?) *(?=\|)", text)
    return _figures(text) | _figures(" ".join(c + "x" for c in cells))


def test_figures_of_performance_and_reliability_md_come_from_the_dated_records():
    """performance.md and reliability.md invent no figure: each speed ratio and throughput they
    state is in a record under docs/bench/ or in "Figures at a glance" (whose derived ratios,
    such as 3.7x = 40.1K / 10.9K, are stated there once)."""
    assert len(RECORDS) >= 4
    recorded = set().union(*(_record_figures(r.read_text()) for r in RECORDS))
    allowed = recorded | _figures(_glance())
    checked, wrong = 0, []
    for name in ("performance.md", "reliability.md"):
        for line in (ROOT / "docs" / name).read_text().splitlines():
            for figure in sorted(_figures(line)):
                checked += 1
                if figure not in allowed:
                    wrong.append(f"docs/{name}: {figure} is in no record of docs/bench/: {line.strip()}")
    assert checked >= 40
    assert not wrong, "\n".join(wrong)


def test_every_dated_raw_file_named_in_the_docs_is_in_docs_bench():
    """`count-steady-2026-11-24.json` and the like (or a pattern, `scaling-*-2026-11-22.json`), named
    in the guides and the records, are there."""
    bench = ROOT / "docs" / "bench"
    named = {(_rel(doc), m) for doc in [*DOCS, *RECORDS] for code in _code(doc.read_text())
             for m in re.findall(r"(?<![\w*-])([\w.*-]*\d{4}-\d{2}-\d{2}[\w.-]*\.(?:json|md))\b", code)}
    assert len(named) >= 20
    missing = sorted(f"{doc}: {name}" for doc, name in named if not list(bench.glob(Path(name).name)))
    assert not missing, "\n".join(missing)


# --- settings: the declarations (sparkstate.jobs.settings) ------------------------------------


def test_every_sparkstate_variable_in_the_docs_is_a_declared_setting_or_read_by_the_code():
    """`SPARKSTATE_TIME_MODE` in a doc is the variable of a declared setting; the others the docs
    name (SPARKSTATE_CACHE, SPARKSTATE_JVM_ARCHIVE, ...) are read somewhere in src/ or tests/."""
    from sparkstate.jobs.config import all_settings
    from sparkstate.jobs.settings import ENV_PREFIX

    declared = {s.env for s in all_settings().values()} | {ENV_PREFIX + "PIPELINE", ENV_PREFIX + "CONFIG"}
    code = "\n".join(p.read_text() for d in ("src", "tests") for p in (ROOT / d).rglob("*.py"))
    named = {(_rel(doc), v) for doc in DOCS for v in re.findall(r"\bSPARKSTATE_[A-Z_]*[A-Z]\b", doc.read_text())}
    assert len(named) >= 5
    wrong = sorted(f"{doc}: {v}" for doc, v in named if v not in declared and f'"{v}"' not in code)
    assert not wrong, "\n".join(wrong)


def test_every_declared_setting_has_its_flag_and_help():
    """`sparkstate run --help` shows each declared setting with its variable (one flag per declaration)."""
    from sparkstate.jobs.config import all_settings

    run = _flags(commands()[("run",)])
    for s in all_settings().values():
        assert s.flag in run, s.name
        assert s.env in (run[s.flag].help or ""), s.name
        assert len(run[s.flag].help) > 20, s.name


# --- the package: README's versions and extras are pyproject.toml's ---------------------------


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _range(spec: str) -> set[str]:
    """`pandas>=2.2,<3` -> {">=2.2", "<3"}; README's ">= 2.2, < 3" the same."""
    return {p.replace(" ", "") for p in re.split(r",", re.sub(r"^[A-Za-z0-9_.\[\]-]+", "", spec.split(";")[0])) if p.strip()}


def test_readme_versions_table_is_the_declared_dependencies():
    """Each dependency README.md's "Supported versions" table names has the range pyproject.toml
    declares, and every dependency the package imports at its top level is declared."""
    project = _pyproject()
    declared = {re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower(): _range(d) for d in project["dependencies"]}
    table = (ROOT / "README.md").read_text().split("| Supported versions |", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| (\w+) \| ([^|(]+?)\s*(?:\(.*\))? \|$", table, re.M))
    assert {"Python", "PySpark", "pyarrow", "pandas", "numpy"} <= set(rows)
    assert _range(rows.pop("Python")) == _range(project["requires-python"])
    rows.pop("Java")
    for name, spec in rows.items():
        assert _range(spec) == declared[name.lower()], name
    imported = {m.group(1) for p in PACKAGE.rglob("*.py")
                for m in re.finditer(r"^(?:import|from) (numpy|pyarrow|pandas|pyspark|google\.protobuf|rich)\b",
                                     p.read_text(), re.M)}
    names = {"google.protobuf": "protobuf"}
    assert {names.get(m, m) for m in imported} <= set(declared)


def test_every_extra_is_documented_in_install_md_and_known_to_the_checks():
    from sparkstate.extras import EXTRAS

    extras = set(_pyproject()["optional-dependencies"]) - {"test"}
    install = (ROOT / "docs" / "install.md").read_text()
    assert {e for e in extras if f"| `{e}` |" not in install} == set()
    assert set(EXTRAS) == extras


def test_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{doc.name})" in readme, f"README's map of the docs has no {doc.name}"
