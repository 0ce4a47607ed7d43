"""Python types <-> Spark types, and the codecs between them (``sparkstate.types``). No Spark needed."""

from __future__ import annotations

import datetime as dt
import decimal
import typing
from dataclasses import dataclass, field
from typing import Optional

import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

import sparkstate as ss
from sparkstate import types as sst
from sparkstate.types import Codec, compatible, decoder_for, encoder_for, parse_schema, record_decoder, spark_type_of


# --- dataclasses used as state, value and output types (module level: annotations must resolve) --

@dataclass
class Point:
    x: int
    y: int


@dataclass
class Shape:
    name: str
    origin: Point
    corners: list[Point]
    tags: dict[str, Point]
    note: Optional[str] = None


@dataclass
class Session:
    user: str
    start: dt.datetime
    pages: list[str]
    counts: dict[str, int]
    day: dt.date
    score: float
    active: bool
    blob: bytes
    amount: decimal.Decimal


@dataclass
class VisitV1:
    user: str
    pages: list[str]


@dataclass
class VisitV2:  # VisitV1 with fields added later, with defaults
    user: str
    pages: list[str]
    count: int = 7
    seen: list[str] = field(default_factory=lambda: ["first"])
    label: Optional[str] = "x"


@dataclass
class WithDerived:
    a: int
    total: int = field(init=False, default=0)


@dataclass(frozen=True)
class FrozenPair:
    a: int
    b: str


@dataclass
class HoldsSet:
    x: set[int]


@dataclass
class Wrapper:
    inner: HoldsSet


@dataclass
class Deep:
    wrapper: Wrapper


@dataclass
class HoldsUnion:
    value: int | str


@dataclass
class HoldsFixedTuple:
    pair: tuple[int, str]


@dataclass
class HoldsBareList:
    items: list


@dataclass
class HoldsBareDict:
    items: dict


@dataclass
class ListOfBadDataclass:
    points: list[HoldsSet]


@dataclass
class Unresolvable:
    thing: "NoSuchTypeAnywhere"  # noqa: F821


@dataclass
class Event:
    user: str
    n: int
    score: float


@dataclass
class Nested:
    user: str
    point: Point


# --- spark_type_of ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("tp", "spark"),
    [
        (bool, BooleanType()),
        (int, LongType()),
        (float, DoubleType()),
        (str, StringType()),
        (bytes, BinaryType()),
        (dt.datetime, TimestampType()),
        (dt.date, DateType()),
        (decimal.Decimal, DecimalType(38, 18)),
    ],
)
def test_spark_type_of_primitives(tp, spark):
    assert spark_type_of(tp) == spark


@pytest.mark.parametrize(
    ("tp", "simple"),
    [
        (list[int], "array<bigint>"),
        (typing.List[str], "array<string>"),
        (tuple[float, ...], "array<double>"),
        (dict[str, int], "map<string,bigint>"),
        (typing.Dict[str, bool], "map<string,boolean>"),
        (dict[str, list[int]], "map<string,array<bigint>>"),
        (list[dict[str, dt.datetime]], "array<map<string,timestamp>>"),
        (Optional[int], "bigint"),
        (int | None, "bigint"),
        (Optional[list[str]], "array<string>"),
        (list[Optional[int]], "array<bigint>"),
    ],
)
def test_spark_type_of_containers_and_optional(tp, simple):
    assert spark_type_of(tp).simpleString() == simple


def test_spark_type_of_nested_dataclasses():
    assert spark_type_of(Shape).simpleString() == (
        "struct<name:string,origin:struct<x:bigint,y:bigint>,corners:array<struct<x:bigint,y:bigint>>,"
        "tags:map<string,struct<x:bigint,y:bigint>>,note:string>"
    )


def test_spark_type_of_makes_every_field_and_element_nullable():
    st = spark_type_of(Shape)
    assert all(f.nullable for f in st.fields)
    assert st["corners"].dataType.containsNull
    assert st["tags"].dataType.valueContainsNull


def test_spark_type_of_passes_spark_types_through():
    st = StructType([StructField("a", IntegerType())])
    assert spark_type_of(st) is st
    assert spark_type_of(ShortType()) == ShortType()


@pytest.mark.parametrize(
    ("tp", "message"),
    [
        (set[int], r"^type: type set\[int\] cannot be stored; supported: int, float, .*Optional\[T\]$"),
        (list, r"^type: a bare list needs its element type, e.g. list\[str\]$"),
        (tuple, r"^type: a bare tuple needs its element type"),
        (dict, r"^type: a bare dict needs key and value types, e.g. dict\[str, int\]$"),
        (tuple[int, str], r"^type: fixed-size tuples cannot be stored; use tuple\[T, \.\.\.\], list\[T\] or a dataclass$"),
        (dict[str], r"^type: dict needs key and value types, e.g. dict\[str, int\]$"),
        (int | str, r"^type: unions other than Optional\[T\] cannot be stored; got int \| str"),
        (typing.Union[int, str, None], r"^type: unions other than Optional\[T\] cannot be stored"),
        (complex, r"^type: type <class 'complex'> cannot be stored"),
        (object, r"^type: type <class 'object'> cannot be stored"),
    ],
)
def test_spark_type_of_rejects_unstorable_types(tp, message):
    with pytest.raises(ss.StateTypeError, match=message):
        spark_type_of(tp)


def test_spark_type_of_rejects_an_unhashable_non_type_with_a_state_type_error():
    with pytest.raises(ss.StateTypeError, match=r"^state_type: type \[<class 'int'>\] cannot be stored"):
        spark_type_of([int], "state_type")


def test_state_type_errors_are_also_type_errors_and_library_errors():
    with pytest.raises(TypeError) as info:
        spark_type_of(set[int])
    assert isinstance(info.value, ss.SparkStateError)


@pytest.mark.parametrize(
    ("tp", "path", "what"),
    [
        (Wrapper, r"state_type\.inner\.x", r"type set\[int\] cannot be stored"),
        (Deep, r"state_type\.wrapper\.inner\.x", r"type set\[int\] cannot be stored"),
        (HoldsUnion, r"state_type\.value", r"unions other than Optional\[T\] cannot be stored"),
        (HoldsFixedTuple, r"state_type\.pair", "fixed-size tuples cannot be stored"),
        (HoldsBareList, r"state_type\.items", "a bare list needs its element type"),
        (HoldsBareDict, r"state_type\.items", "a bare dict needs key and value types"),
        (ListOfBadDataclass, r"state_type\.points\[\]\.x", r"type set\[int\] cannot be stored"),
        (dict[str, HoldsSet], r"state_type\.value\.x", r"type set\[int\] cannot be stored"),
        (dict[HoldsSet, int], r"state_type\.key\.x", r"type set\[int\] cannot be stored"),
    ],
)
def test_codec_errors_name_the_field_path(tp, path, what):
    with pytest.raises(ss.StateTypeError, match=rf"^{path}: {what}"):
        Codec.of(tp)


def test_codec_of_a_union_names_where():
    with pytest.raises(ss.StateTypeError, match=r"^state_type: unions other than Optional\[T\] cannot be stored"):
        Codec.of(int | str)


def test_unresolvable_annotations_are_reported_with_the_dataclass_name():
    with pytest.raises(ss.StateTypeError, match=r"cannot read the type annotations of dataclass Unresolvable: .*"
                                                r"NoSuchTypeAnywhere.*Define the dataclass at module level"):
        Codec.of(Unresolvable)


# --- Codec: round trips ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("tp", "value"),
    [
        (int, 42),
        (int, -(2**62)),
        (float, 2.5),
        (str, "héllo"),
        (bool, True),
        (bytes, b"\x00\xff"),
        (dt.datetime, dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=dt.timezone.utc)),
        (dt.date, dt.date(2024, 2, 29)),
        (decimal.Decimal, decimal.Decimal("12.500")),
        (list[int], [3, 1, 2]),
        (list[str], []),
        (dict[str, int], {"a": 1, "b": 2}),
        (dict[str, list[int]], {"a": [1, 2], "b": []}),
        (list[dict[str, float]], [{"x": 1.5}, {}]),
        (tuple[int, ...], (1, 2, 3)),
        (Optional[int], 5),
        (Point, Point(1, 2)),
        (FrozenPair, FrozenPair(1, "b")),
        (list[Point], [Point(1, 2), Point(3, 4)]),
        (dict[str, Point], {"o": Point(0, 0), "p": Point(5, 6)}),
    ],
)
def test_codec_round_trips(tp, value):
    codec = Codec.of(tp)
    back = codec.decode(codec.encode(value))
    assert back == value
    assert type(back) is type(value)


def test_codec_round_trips_nested_dataclasses_with_lists_and_dicts_of_dataclasses():
    codec = Codec.of(Shape)
    shape = Shape("sq", Point(0, 0), [Point(0, 1), Point(1, 1)], {"c": Point(9, 9)}, note="n")
    back = codec.decode(codec.encode(shape))
    assert back == shape
    assert type(back.origin) is Point
    assert all(type(p) is Point for p in back.corners)
    assert type(back.tags["c"]) is Point


def test_codec_round_trips_every_primitive_inside_a_dataclass():
    codec = Codec.of(Session)
    s = Session("u", dt.datetime(2024, 1, 1, 12, 30, tzinfo=dt.timezone.utc), ["p1", "p2"], {"p1": 2},
                dt.date(2024, 1, 1), 0.5, False, b"raw", decimal.Decimal("1.25"))
    assert codec.decode(codec.encode(s)) == s


def test_codec_decodes_datetimes_as_utc_aware_datetimes_of_the_same_instant():
    codec = Codec.of(dt.datetime)
    naive = dt.datetime(2024, 5, 6, 7, 8, 9, 10)  # naive: local time, as Spark hands it over
    back = codec.decode(codec.encode(naive))
    assert back.utcoffset() == dt.timedelta(0)
    assert back == naive.astimezone(dt.timezone.utc)
    plus_two = dt.datetime(2024, 1, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    back = codec.decode(plus_two)
    assert back == plus_two
    assert (back.hour, back.utcoffset()) == (10, dt.timedelta(0))


def test_codec_decodes_datetimes_inside_dataclasses_and_containers_as_utc():
    when = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    s = Codec.of(Session).decode(("u", when, [], {}, dt.date(2024, 5, 6), 1.0, True, b"", decimal.Decimal(1)))
    assert s.start == when and s.start.utcoffset() == dt.timedelta(0)
    back = Codec.of(dict[str, list[dt.datetime]]).decode({"k": [when]})
    assert back == {"k": [when]} and back["k"][0].utcoffset() == dt.timedelta(0)


def test_codec_encodes_a_dataclass_as_a_row_with_its_field_names():
    enc = Codec.of(Shape).encode(Shape("s", Point(1, 2), [Point(3, 4)], {"k": Point(5, 6)}))
    assert isinstance(enc, Row)
    assert enc.asDict(recursive=True) == {
        "name": "s",
        "origin": {"x": 1, "y": 2},
        "corners": [{"x": 3, "y": 4}],
        "tags": {"k": {"x": 5, "y": 6}},
        "note": None,
    }


def test_codec_encodes_containers_to_plain_lists_and_dicts():
    assert Codec.of(tuple[int, ...]).encode((1, 2)) == [1, 2]
    assert Codec.of(list[int]).encode(x for x in (1, 2)) == [1, 2]
    assert Codec.of(dict[str, int]).encode({"a": 1}) == {"a": 1}


def test_codec_round_trips_a_dataclass_with_a_non_init_field():
    codec = Codec.of(WithDerived)
    value = WithDerived(3)
    value.total = 99
    back = codec.decode(codec.encode(value))
    assert (back.a, back.total) == (3, 99)


def test_codec_decodes_float_fields_stored_as_ints_to_floats():
    back = Codec.of(Event).decode(("u", 1, 3))
    assert back.score == 3.0
    assert isinstance(back.score, float)
    assert isinstance(Codec.of(float).decode(4), float)


def test_codec_encodes_ints_for_float_fields_as_floats():
    enc = Codec.of(Event).encode(Event("u", 1, 2))
    assert enc.score == 2.0 and isinstance(enc.score, float)


@pytest.mark.parametrize(
    "given",
    [
        {"x": 1, "y": 2},
        Row(x=1, y=2),
        Row(y=2, x=1),
        (1, 2),
        [1, 2],
        Point(1, 2),
    ],
)
def test_codec_accepts_a_struct_as_dict_row_tuple_or_dataclass(given):
    codec = Codec.of(Point)
    assert codec.decode(codec.encode(given)) == Point(1, 2)


def test_codec_none_encodes_and_decodes_to_none():
    for tp in (Point, list[int], dict[str, int], int, str):
        codec = Codec.of(tp)
        assert codec.encode(None) is None
        assert codec.decode(None) is None


# --- Codec: state written by an older version of the dataclass --------------------------------------

def test_decode_of_a_row_with_null_for_a_newer_field_uses_the_default():
    old = Codec.of(VisitV1).encode(VisitV1("a", ["p1"]))
    back = Codec.of(VisitV2).decode(tuple(old) + (None, None, None))
    assert back == VisitV2("a", ["p1"], count=7, seen=["first"], label=None)


def test_decode_calls_default_factory_for_each_row():
    codec = Codec.of(VisitV2)
    one = codec.decode(("a", [], 1, None, "l"))
    two = codec.decode(("b", [], 2, None, "l"))
    assert one.seen == ["first"]
    assert one.seen is not two.seen


def test_decode_keeps_none_for_an_optional_field_even_with_a_default():
    # None is a valid value of Optional[str]: it is not replaced by the default "x".
    assert Codec.of(VisitV2).decode(("a", [], 1, ["s"], None)).label is None


def test_decode_of_a_dict_missing_newer_fields_uses_the_defaults():
    back = Codec.of(VisitV2).decode({"user": "a", "pages": ["p"]})
    assert back == VisitV2("a", ["p"], count=7, seen=["first"], label=None)


def test_decode_of_a_shorter_tuple_uses_the_dataclass_defaults():
    assert Codec.of(VisitV2).decode(("a", ["p"])) == VisitV2("a", ["p"])


def test_decode_of_a_row_with_fields_in_another_order_matches_them_by_name():
    assert Codec.of(Nested).decode(Row(user="u", point=Row(y=2, x=1))) == Nested("u", Point(1, 2))


def test_decode_of_a_row_with_extra_fields_ignores_them():
    assert Codec.of(Point).decode(Row(z=0, y=2, x=1)) == Point(1, 2)


# --- Codec: columns ------------------------------------------------------------------------------------

def test_codec_columns_of_a_dataclass_are_its_fields():
    codec = Codec.of(Point)
    assert codec.is_struct
    assert codec.fields == ("x", "y")
    assert codec.columns.simpleString() == "struct<x:bigint,y:bigint>"
    assert codec.encode_columns(Point(1, 2)) == (1, 2)
    assert codec.decode_columns((1, 2)) == Point(1, 2)


def test_codec_columns_of_a_primitive_is_one_value_column():
    codec = Codec.of(list[int])
    assert not codec.is_struct
    assert codec.fields == ("value",)
    assert codec.columns.simpleString() == "struct<value:array<bigint>>"
    assert codec.encode_columns([1, 2]) == ([1, 2],)
    assert codec.decode_columns(([1, 2],)) == [1, 2]


def test_codec_of_optional_unwraps_it():
    codec = Codec.of(Optional[Point])
    assert codec.py_type is Point
    assert codec.fields == ("x", "y")


# --- encoding type errors name the field -----------------------------------------------------------

@pytest.mark.parametrize(
    ("tp", "value", "message"),
    [
        (Point, Point(1, "2"), r"^state_type\.y: expected an int, got str '2'$"),
        (Point, Point(True, 2), r"^state_type\.x: expected an int, got bool True$"),
        (Point, Point(1.5, 2), r"^state_type\.x: expected an int, got float 1\.5$"),
        (Shape, Shape("s", Point(1, None), [], {}), None),
        (Shape, Shape("s", Point(1, 2), [Point(1, "no")], {}), r"^state_type\.corners\[\]\.y: expected an int, got str 'no'$"),
        (Shape, Shape("s", Point(1, 2), [], {"k": Point("a", 2)}), r"^state_type\.tags\.value\.x: expected an int, got str 'a'$"),
        (Shape, Shape("s", Point(1, 2), [], {3: Point(1, 2)}), r"^state_type\.tags\.key: expected a str, got int 3$"),
        (Shape, Shape("s", "origin", [], {}), r"^state_type\.origin: expected a dataclass, dict, Row or tuple with fields x, y, got str 'origin'$"),
        (Shape, Shape("s", Point(1, 2), "abc", {}), r"^state_type\.corners: expected a list, got str 'abc'$"),
        (Shape, Shape("s", Point(1, 2), [], [1]), r"^state_type\.tags: expected a dict, got list \[1\]$"),
        (Event, Event("u", 1, "high"), r"^state_type\.score: expected a float, got str 'high'$"),
        (Event, Event("u", 1, False), r"^state_type\.score: expected a float, got bool False$"),
        (Session, Session("u", dt.date(2024, 1, 1), [], {}, dt.date(2024, 1, 1), 1.0, True, b"", decimal.Decimal(1)),
         r"^state_type\.start: expected a datetime, got date datetime\.date\(2024, 1, 1\)$"),
        (Session, Session("u", dt.datetime(2024, 1, 1), [], {}, dt.datetime(2024, 1, 1), 1.0, True, b"", decimal.Decimal(1)),
         r"^state_type\.day: expected a date, got datetime"),
        (Session, Session("u", dt.datetime(2024, 1, 1), [], {}, dt.date(2024, 1, 1), 1.0, 1, b"", decimal.Decimal(1)),
         r"^state_type\.active: expected a bool, got int 1$"),
        (Session, Session("u", dt.datetime(2024, 1, 1), [], {}, dt.date(2024, 1, 1), 1.0, True, "s", decimal.Decimal(1)),
         r"^state_type\.blob: expected bytes, got str 's'$"),
        (Session, Session("u", dt.datetime(2024, 1, 1), [], {}, dt.date(2024, 1, 1), 1.0, True, b"", 1.5),
         r"^state_type\.amount: expected a Decimal, got float 1\.5$"),
        (int, "3", r"^state_type: expected an int, got str '3'$"),
        (list[int], {1: 2}, r"^state_type: expected a list, got dict \{1: 2\}$"),
        (list[int], 5, r"^state_type: expected a list, got int 5$"),
    ],
)
def test_encoder_type_errors_name_the_field(tp, value, message):
    codec = Codec.of(tp)
    if message is None:  # None is allowed in every field: Spark columns are nullable
        assert codec.encode(value).origin.y is None
        return
    with pytest.raises(ss.StateTypeError, match=message):
        codec.encode(value)


def test_encoder_reports_a_struct_tuple_of_the_wrong_length():
    with pytest.raises(ss.StateTypeError, match=r"^state_type\.origin: expected 2 values \(x, y\), got a tuple of 3: \(1, 2, 3\)$"):
        Codec.of(Shape).encode(("s", (1, 2, 3), [], {}, None))


def test_encoder_reports_a_missing_dict_field_and_the_fields_it_got():
    with pytest.raises(ss.StateTypeError, match=r"^state_type: missing field 'y'; got fields x, z$"):
        Codec.of(Point).encode({"x": 1, "z": 2})


def test_encoder_reports_a_missing_row_field():
    with pytest.raises(ss.StateTypeError, match=r"^state_type: missing field 'y'; got fields x$"):
        Codec.of(Point).encode(Row(x=1))


def test_encoder_reports_a_dataclass_of_another_shape():
    with pytest.raises(ss.StateTypeError, match=r"^state_type: expected fields x, y; FrozenPair has no 'x'$"):
        Codec.of(Point).encode(FrozenPair(1, "b"))


def test_encoder_for_uses_the_given_where():
    enc = encoder_for(StructType([StructField("n", IntegerType())]), "output_type")
    with pytest.raises(ss.StateTypeError, match=r"^output_type\.n: expected an int, got str 'x'$"):
        enc({"n": "x"})


def test_encoder_for_timestamp_ntz_and_decimal_accepts_ints():
    assert encoder_for(TimestampNTZType())(dt.datetime(2024, 1, 1)) == dt.datetime(2024, 1, 1)
    assert encoder_for(DecimalType(10, 2))(3) == 3
    assert encoder_for(FloatType())(1) == 1.0


def test_decoder_for_rebuilds_nested_containers():
    dec = decoder_for(dict[str, list[Point]])
    assert dec({"a": [Row(x=1, y=2)]}) == {"a": [Point(1, 2)]}
    assert decoder_for(tuple[Point, ...])([(1, 2)]) == (Point(1, 2),)


# --- parse_schema -------------------------------------------------------------------------------------

def test_parse_schema_returns_a_struct_type_unchanged():
    st = StructType([StructField("word", StringType()), StructField("count", LongType())])
    assert parse_schema(st) is st


def test_parse_schema_of_a_dataclass():
    assert parse_schema(Nested).simpleString() == "struct<user:string,point:struct<x:bigint,y:bigint>>"


def test_parse_schema_of_a_dataclass_with_an_unstorable_field_names_it():
    with pytest.raises(ss.StateTypeError, match=r"^output_type\.inner\.x: type set\[int\] cannot be stored"):
        parse_schema(Wrapper)


def test_parse_schema_of_ddl_returns_what_spark_parses(monkeypatch):
    parsed = StructType([StructField("word", StringType()), StructField("count", LongType())])
    seen = []

    def fake_parse(ddl):
        seen.append(ddl)
        return parsed

    monkeypatch.setattr(sst.codec, "parse_ddl", fake_parse)
    assert parse_schema("word string, count long") is parsed
    assert seen == ["word string, count long"]


def test_parse_schema_rejects_ddl_of_a_single_non_struct_type(monkeypatch):
    monkeypatch.setattr(sst.codec, "parse_ddl", lambda ddl: ArrayType(LongType()))
    with pytest.raises(ss.StateTypeError, match=r"^output_type: expected a list of columns such as"
                                                r" 'word string, count long', got 'array<bigint>'$"):
        parse_schema("array<bigint>")


def test_parse_schema_reports_invalid_ddl_with_the_parser_message(monkeypatch):
    def fail(ddl):
        raise RuntimeError("[PARSE_SYNTAX_ERROR] Syntax error at or near ','")

    monkeypatch.setattr(sst.codec, "parse_ddl", fail)
    with pytest.raises(ss.StateTypeError, match=r"^out: 'word strng,' is not a valid DDL schema \(e\.g\. 'word string,"
                                                r" count long'\): \[PARSE_SYNTAX_ERROR\] Syntax error at or near ','$"):
        parse_schema("word strng,", "out")


def test_parse_schema_of_ddl_without_spark_says_a_session_is_needed(monkeypatch):
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    # Hide any session another test module started in this process.
    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    with pytest.raises(ss.StateTypeError, match=r"^output_type: reading the DDL string 'word string' needs a running"
                                                r" SparkSession, and there is none\. Start one first"):
        parse_schema("word string")


@pytest.mark.parametrize(("tp", "ddl"), [(int, "value bigint"), (str, "value string"), (dt.datetime, "value timestamp")])
def test_parse_schema_of_a_primitive_suggests_a_one_column_ddl(tp, ddl):
    with pytest.raises(ss.StateTypeError, match=rf"^output_type: expected a dataclass, a StructType or a DDL string of"
                                                rf" columns, got {tp.__name__}; for a single column write e\.g\. '{ddl}'$"):
        parse_schema(tp)


@pytest.mark.parametrize(("spec", "shown"), [(None, "None"), (["a"], r"\['a'\]"), (Point(1, 2), r"Point\(x=1, y=2\)"),
                                             (LongType(), r"LongType\(\)")])
def test_parse_schema_rejects_anything_else(spec, shown):
    with pytest.raises(ss.StateTypeError, match=rf"^value_type: expected a dataclass, a StructType or a DDL string, got {shown}$"):
        parse_schema(spec, "value_type")


# --- compatible -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("declared", "actual", "ok"),
    [
        (LongType(), IntegerType(), True),
        (IntegerType(), LongType(), True),
        (DoubleType(), IntegerType(), True),
        (DoubleType(), FloatType(), True),
        (LongType(), DoubleType(), False),
        (StringType(), LongType(), False),
        (TimestampType(), TimestampNTZType(), True),
        (TimestampNTZType(), TimestampType(), False),
        (DecimalType(10, 2), DecimalType(10, 2), True),
        (DecimalType(10, 2), DecimalType(12, 2), False),
        (ArrayType(LongType()), ArrayType(IntegerType()), True),
        (ArrayType(LongType()), ArrayType(StringType()), False),
        (MapType(StringType(), DoubleType()), MapType(StringType(), LongType()), True),
        (MapType(StringType(), DoubleType()), MapType(LongType(), DoubleType()), False),
        (spark_type_of(Point), StructType([StructField("y", IntegerType()), StructField("x", LongType()),
                                           StructField("z", StringType())]), True),
        (spark_type_of(Point), StructType([StructField("x", LongType())]), False),
        (spark_type_of(Point), StructType([StructField("x", LongType()), StructField("y", StringType())]), False),
        (StringType(), ArrayType(StringType()), False),
    ],
)
def test_compatible(declared, actual, ok):
    assert compatible(declared, actual) is ok


# --- record_decoder --------------------------------------------------------------------------------------

EVENT_SCHEMA = StructType(
    [StructField("extra", StringType()), StructField("score", IntegerType()), StructField("user", StringType()),
     StructField("n", IntegerType())]
)


def test_record_decoder_matches_columns_by_name_and_ignores_extra_columns():
    decode = record_decoder(Event, EVENT_SCHEMA)
    back = decode(Row(extra="?", score=3, user="u", n=2))
    assert back == Event("u", 2, 3.0)
    assert isinstance(back.score, float)


def test_record_decoder_matches_nested_struct_fields_by_name():
    schema = StructType([StructField("point", StructType([StructField("y", LongType()), StructField("x", LongType())])),
                         StructField("user", StringType())])
    decode = record_decoder(Nested, schema)
    assert decode(Row(point=Row(y=2, x=1), user="u")) == Nested("u", Point(1, 2))


def test_record_decoder_rejects_a_non_dataclass():
    with pytest.raises(ss.StateTypeError, match=r"^value_type: expected a dataclass, got <class 'int'>$"):
        record_decoder(int, EVENT_SCHEMA)


def test_record_decoder_names_a_missing_column_and_lists_the_columns():
    schema = StructType([StructField("user", StringType()), StructField("score", DoubleType())])
    with pytest.raises(ss.StateTypeError, match=r"^value_type Event does not match the input: field 'n' has no column"
                                                r" \(columns: user, score\)$"):
        record_decoder(Event, schema)


def test_record_decoder_names_a_type_mismatch_with_both_types():
    schema = StructType([StructField("user", StringType()), StructField("n", StringType()), StructField("score", DoubleType())])
    with pytest.raises(ss.StateTypeError, match=r"^value_type Event does not match the input: field 'n' is bigint but"
                                                r" the column is string$"):
        record_decoder(Event, schema)


def test_record_decoder_lists_every_problem_at_once():
    schema = StructType([StructField("user", LongType()), StructField("score", StringType())])
    with pytest.raises(ss.StateTypeError) as info:
        record_decoder(Event, schema, where="value_type (events)")
    message = str(info.value)
    assert message.startswith("value_type (events) Event does not match the input: ")
    assert "field 'user' is string but the column is bigint" in message
    assert "field 'n' has no column (columns: user, score)" in message
    assert "field 'score' is double but the column is string" in message
    assert message.count(";") == 2


def test_record_decoder_names_a_nested_struct_that_lacks_a_field():
    schema = StructType([StructField("user", StringType()),
                         StructField("point", StructType([StructField("x", LongType())]))])
    with pytest.raises(ss.StateTypeError, match=r"field 'point' is struct<x:bigint,y:bigint> but the column is"
                                                r" struct<x:bigint>"):
        record_decoder(Nested, schema)


# --- integers outside their Spark type's range ------------------------------------------------

@pytest.mark.parametrize("t, lo, hi", [(ByteType(), -128, 127), (ShortType(), -2**15, 2**15 - 1),
                                       (IntegerType(), -2**31, 2**31 - 1), (LongType(), -2**63, 2**63 - 1)])
def test_an_int_outside_its_types_range_is_refused_in_words(t, lo, hi):
    kind = t.simpleString()
    st = StructType([StructField("k", StringType()), StructField("n", t), StructField("xs", ArrayType(t))])
    enc = encoder_for(st, "output")
    assert tuple(enc(("a", lo, [hi, None, lo]))) == ("a", lo, [hi, None, lo])
    with pytest.raises(ss.StateTypeError, match=rf"output.n: {hi + 1} does not fit in {kind} \({lo} to {hi}\)"):
        enc(("a", hi + 1, []))
    with pytest.raises(ss.StateTypeError, match=rf"output.xs\[\]: {lo - 1} does not fit in {kind}"):
        enc(("a", 0, [0, None, lo - 1]))
    # column by column: the same check, and the refused record's index
    cols = sst.columns_encoder(st, "output")
    assert cols([("a", lo, [hi]), ("b", None, None)]) == [["a", "b"], [lo, None], [[hi], None]]
    with pytest.raises(sst.RowTypeError) as err:
        cols([("a", 1, []), ("b", None, []), ("c", lo - 1, [])])
    assert err.value.index == 2 and "does not fit in" in str(err.value)
