"""Hostile input records for the fuzz tests (Hypothesis strategies), each with what must become of it.

A :class:`Hostile` record is the exact bytes a source delivers (``None``: a Kafka null value) and
its expected fate: ``"good"`` (must be processed; ``word`` is what the output must hold),
``"dead"`` (must be one dead letter), or ``"either"`` (a documented edge case: processed or a
dead letter, but exactly once). The word is the ``running-count`` pipeline's one field.

Examples are drawn up front with a fixed seed (:func:`draw`), so that one Spark stream carries
many of them. ``SPARKSTATE_FUZZ_EXAMPLES`` sets how many records a stream gets (``make fuzz``
raises it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from hypothesis import strategies as st

#: Records per fuzzed stream (``make fuzz`` sets a much larger count).
EXAMPLES = int(os.environ.get("SPARKSTATE_FUZZ_EXAMPLES", "60"))


@dataclass(frozen=True)
class Hostile:
    kind: str
    value: bytes | None
    expect: str  # "good" | "dead" | "either"
    word: str | None = None


# Characters that break naive writers: NUL, CR/LF, BOM, line/paragraph separators, quotes,
# backslashes, non-BMP characters, and anything else that is valid Unicode (no lone surrogates).
_NASTY = st.sampled_from(["\x00", "\r", "\n", "\r\n", "\ufeff", "\u2028", "\u2029", '"', "\\", "\U0001d11e", "é",
                          "\x7f", "\t", ",", "'"])
_TEXT = st.lists(_NASTY | st.characters(codec="utf-8"), max_size=12).map("".join)

# Invalid UTF-8: a lone continuation byte, bytes never valid, an overlong '/', an encoded
# surrogate (CESU), a 5-byte form, a cut 3-byte sequence, and a byte-order mark before the JSON.
_BAD_BYTES = st.sampled_from([b"\x80", b"\xff\xfe\x00", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80",
                              b"\xe2\x82", b"\xfe", b"\x00"])
_BOM = b"\xef\xbb\xbf"


def _good_json(word: str, ascii_only: bool) -> bytes:
    return json.dumps({"word": word}, ensure_ascii=ascii_only).encode("utf-8")


_good = st.builds(lambda w, a: Hostile("good", _good_json(w, a), "good", w), _TEXT, st.booleans())
_bad_prefix = st.builds(lambda b, w: Hostile("invalid utf-8 before the JSON", b + _good_json(w, True), "dead"),
                        _BAD_BYTES | st.just(_BOM), _TEXT)


@st.composite
def _truncated(draw) -> Hostile:
    whole = _good_json(draw(_TEXT), draw(st.booleans()))
    cut = draw(st.integers(1, len(whole) - 1))
    return Hostile("truncated JSON", whole[:cut], "dead")


_not_object = st.sampled_from([b"[1, 2]", b'"word"', b"42", b"null", b"true", b"{oops}", b"}{"]).map(
    lambda v: Hostile("not a JSON object", v, "dead"))
# JSON escapes of NUL and of lone or paired surrogates (valid JSON; Python's json refuses none of them).
_escapes = st.lists(st.sampled_from(["\\u0000", "\\ud800", "\\udfff", "\\ud83d\\ude00", "\\udc00\\ud800", "a"]),
                    min_size=1, max_size=4).map(
    lambda parts: Hostile("JSON escape", ('{"word": "' + "".join(parts) + '"}').encode(), "either"))
_bytes_in_string = st.builds(
    lambda b, w: Hostile("invalid utf-8 in a string", b'{"word": "' + w.encode()[:4] + b + b'"}', "either"),
    _BAD_BYTES, st.text(alphabet="abc", max_size=4))
_duplicates = st.builds(lambda a, b: Hostile("duplicate keys", _good_json(a, True)[:-1] + b", " + _good_json(b, True)[1:],
                                             "either"), _TEXT, _TEXT)
_numbers = st.sampled_from(["1e400", "-1e400", "NaN", "Infinity", "-Infinity", "123456789012345678901234567890",
                            "-0", "0.1e-400", "true", "null"]).map(
    lambda n: Hostile("number out of range", ('{"word": ' + n + "}").encode(), "either"))
_nested = st.integers(1, 1500).map(
    lambda d: Hostile("deeply nested", b'{"word": ' + b"[" * d + b"]" * d + b"}", "either"))
_times = st.sampled_from(["0000-01-01T00:00:00Z", "10000-01-01T00:00:00Z", "-0001-12-31T23:59:59Z"]).map(
    lambda t: Hostile("timestamp out of range", json.dumps({"word": "t", "t": t}).encode(), "good", "t"))

#: Any record a file line can be (no line breaks outside JSON strings: a file splits there).
LINE = st.one_of(_good, _bad_prefix, _truncated(), _not_object, _escapes, _bytes_in_string, _duplicates, _numbers,
                 _nested, _times)
#: Any record a Kafka value can be: a line, a null value, CR/LF between tokens.
KAFKA = st.one_of(LINE, st.just(Hostile("null value", None, "dead")),
                  _TEXT.map(lambda w: Hostile("CR/LF between tokens", b'{\r\n"word":\r\n' + json.dumps(w).encode()
                                              + b"\r\n}", "good", w)))

# CSV records (a file with the header ``word``, one field per record). Spark's CSV reader escapes
# with a backslash (not by doubling quotes), and skips a line that is blank once characters up to
# U+0020 (NUL included) are trimmed: such lines are not records (see the README), so none is drawn.
_CSV_TEXT = _TEXT.map(lambda w: "".join(c for c in w if c not in '\r\n"\\'))


def _csv_line(value: bytes) -> bool:
    return b"\n" not in value and b"\r" not in value and bool(bytes(b for b in value if b > 0x20))


_csv_quoted = _CSV_TEXT.filter(lambda w: w != "").map(
    lambda w: Hostile("quoted CSV field", b'"' + w.encode() + b'"', "good", w))
_csv_plain = _CSV_TEXT.map(lambda w: w.replace(",", "")).filter(lambda w: _csv_line(w.encode())).map(
    lambda w: Hostile("unquoted CSV field", w.encode(), "either"))
_csv_fields = st.lists(st.text(alphabet="abc xyz", max_size=4), min_size=2, max_size=4).map(
    lambda ws: Hostile("too many CSV fields", ",".join(ws).encode(), "dead"))
_csv_empty = st.just(Hostile("empty quoted CSV field", b'""', "dead"))
_csv_bytes = st.builds(lambda b, w: Hostile("invalid utf-8 in a CSV field", b'"' + w.encode() + b + b'"', "either"),
                       _BAD_BYTES, st.text(alphabet="abc", max_size=4))
#: Any record a CSV file line can be (one field, ``word``).
CSV = st.one_of(_csv_quoted, _csv_plain, _csv_fields, _csv_empty, _csv_bytes).filter(lambda h: _csv_line(h.value))


def draw(strategy: st.SearchStrategy, n: int = EXAMPLES) -> list[Hostile]:
    """Up to ``n`` records from ``strategy``, the same ones on every run (Hypothesis, derandomized).

    Hypothesis generates them up front (no Spark inside the test function), so that one stream
    carries them all instead of one Spark query per example.
    """
    from hypothesis import HealthCheck, Phase, given, settings

    out: list[Hostile] = []

    @settings(database=None, derandomize=True, max_examples=n, phases=[Phase.explicit, Phase.generate],
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(x: Hostile) -> None:
        out.append(x)

    collect()
    return out
