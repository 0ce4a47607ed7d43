"""Python types <-> Spark types, and the codecs that move values between them.

In four rooms: :mod:`.mapping` (which Spark type a Python type is), :mod:`.encode` (Python
value -> Spark's external form), :mod:`.decode` (back), :mod:`.codec` (a state type with its
columns, encoder and decoder; schemas from a dataclass, a ``StructType`` or DDL).

Encoding is driven by the Spark type: a struct accepts a dataclass instance, a dict, a
``Row`` or a tuple; an array a list; a map a dict. Decoding is driven by the Python type:
dataclasses are rebuilt positionally, and a stored null in a field that is not ``Optional``
takes the field's default (this is how a state written before a field was added reads back).

Timestamps come back as UTC-aware ``datetime`` objects, as input rows do.

Every encoder and decoder is compiled once per type into a closure, so the per-value cost
is a few attribute reads, not a walk over type annotations.

>>> from dataclasses import dataclass
>>> @dataclass
... class Visit:
...     user: str
...     pages: list[str]
...     count: int = 0
>>> spark_type_of(Visit).simpleString()
'struct<user:string,pages:array<string>,count:bigint>'
>>> codec = Codec.of(Visit)
>>> codec.decode(codec.encode(Visit("a", ["p1"], 2)))
Visit(user='a', pages=['p1'], count=2)
>>> codec.decode(("a", ["p1"], None))   # a row written before `count` existed
Visit(user='a', pages=['p1'], count=0)
"""

from .codec import Codec, parse_schema, record_decoder
from .decode import decoder_for
from .encode import RowTypeError, columns_encoder, encoder_for
from .mapping import compatible, is_dataclass_type, row_class, spark_type_of

__all__ = [
    "Codec", "RowTypeError", "columns_encoder", "compatible", "decoder_for", "encoder_for", "is_dataclass_type",
    "parse_schema", "record_decoder", "row_class", "spark_type_of",
]
