"""Many reads or writes of the leaf map state in one exchange with Spark's state server.

PySpark's ``MapState`` sends one request and waits for its answer before the next: a batch that
touches a few keys in each of many leaves pays one full Python -> JVM -> Python turn per leaf
read and per leaf write (measured: docs/bench/2026-11-24-round2.md, "Round 2, part 4"). The state
server handles the requests of a connection one after the other, in order, and answers each in order
(``TransformWithStateInPySparkStateServer.run``), so the requests of a window can be written
back to back and the answers read after: the same messages, the same order, the same state
store calls, without a turn per message.

That uses the transport inside PySpark's client (``MapStateClient``'s serializer and socket),
which is not a public API. :class:`LeafIO` checks for every piece it needs and for a PySpark
release whose server reads a request whole (``readFully``, since SPARK-53870; checked on 4.1.4,
4.2.1 and 4.3.0, the releases listed in ``_CHECKED_PYSPARK``, whose client pieces are the same:
tests/engines/test_batched_wire.py runs on each through the version matrix), and otherwise, or
for any state object that is not PySpark's (the in-memory stand-ins of the tests and
``benchmarks/loop.py``), makes the same calls one by one through the public ``MapState`` API.

Windows stay small enough that neither side can block the other: a window of reads is about
10 KB of requests (a leaf id each), which the socket buffers hold whole, so it is sent even
while the server waits for its first answers to be read; the answers to writes are a few
bytes each, so the server never waits on them.
"""

from __future__ import annotations

from typing import Any, Iterable

#: requests written before their answers are read
READ_WINDOW = 128
WRITE_WINDOW = 128
#: the PySpark releases whose state server and client were checked for windows (a newer one may
#: change either: it gets the one-by-one public calls until checked and added here)
_CHECKED_PYSPARK = ((4, 1), (4, 2), (4, 3))


def windows_supported() -> bool:
    """Whether this PySpark is one whose state client and server were checked for windows."""
    return _pyspark_version() in _CHECKED_PYSPARK


def _pyspark_version() -> tuple[int, int]:
    import pyspark

    try:
        major, minor = pyspark.__version__.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


class LeafIO:
    """Reads and writes of one map state (``leaf id -> (blob,)``) in windows of requests."""

    def __init__(self, map_state: Any) -> None:
        self.state = map_state
        self._wire = self._find_wire(map_state)
        #: requests sent and answers received since the processor started (for the profile)
        self.exchanges = 0

    @staticmethod
    def _find_wire(map_state: Any) -> Any:
        if not windows_supported():
            return None
        client = getattr(map_state, "_mapStateClient", None)
        name = getattr(map_state, "_stateName", None)
        api = getattr(client, "_stateful_processor_api_client", None)
        need = ("sockfile", "_serialize_to_bytes", "_deserialize_from_bytes", "_receive_proto_message")
        if name is None or api is None or not all(hasattr(api, a) for a in need):
            return None
        if not hasattr(client, "user_key_schema") or not hasattr(client, "value_schema"):
            return None
        try:
            import pyspark.sql.streaming.proto.StateMessage_pb2 as messages
        except ImportError:
            return None
        if not all(hasattr(messages, m) for m in ("GetValue", "UpdateValue", "RemoveKey", "MapStateCall",
                                                  "StateVariableRequest", "StateRequest")):
            return None
        return client, api, name, messages

    @property
    def pipelined(self) -> bool:
        return self._wire is not None

    # -- the public API, one call at a time ---------------------------------------------------
    def _get_each(self, lids: list[int]) -> list[Any]:
        out = []
        for lid in lids:
            row = self.state.getValue((lid,))
            out.append(None if row is None else row[0])
        return out

    # -- reads ---------------------------------------------------------------------------------
    def get_many(self, lids: list[int]) -> list[Any]:
        """The blob stored under each leaf id (None where there is none), in order."""
        if not lids:
            return []
        if self._wire is None:
            return self._get_each(lids)
        client, api, name, m = self._wire
        ser, schema = api._serialize_to_bytes, client.user_key_schema
        f = api.sockfile
        out: list[Any] = []
        for start in range(0, len(lids), READ_WINDOW):
            window = lids[start:start + READ_WINDOW]
            for lid in window:
                msg = m.StateRequest(stateVariableRequest=m.StateVariableRequest(mapStateCall=m.MapStateCall(
                    stateName=name, getValue=m.GetValue(userKey=ser(schema, (lid,)))))).SerializeToString()
                f.write(_frame(msg))
            f.flush()
            for _ in window:
                status, error, value = api._receive_proto_message()
                if status != 0:
                    raise _state_error("reading", name, error)
                out.append(api._deserialize_from_bytes(value)[0] if len(value) else None)
            self.exchanges += 1
        return out

    # -- writes --------------------------------------------------------------------------------
    def write_many(self, puts: Iterable[tuple[int, bytes]], removes: Iterable[int] = ()) -> None:
        """Store each ``(leaf id, blob)`` of ``puts`` and remove each id of ``removes``, in order
        (removes first: a split writes new ids and removes the old one, never the same id)."""
        ops = [(lid, None) for lid in removes] + list(puts)
        if not ops:
            return
        if self._wire is None:
            for lid, blob in ops:
                if blob is None:
                    self.state.removeKey((lid,))
                else:
                    self.state.updateValue((lid,), (blob,))
            return
        client, api, name, m = self._wire
        ser, kschema, vschema = api._serialize_to_bytes, client.user_key_schema, client.value_schema
        f = api.sockfile
        for start in range(0, len(ops), WRITE_WINDOW):
            window = ops[start:start + WRITE_WINDOW]
            for lid, blob in window:
                key = ser(kschema, (lid,))
                if blob is None:
                    call = m.MapStateCall(stateName=name, removeKey=m.RemoveKey(userKey=key))
                else:
                    call = m.MapStateCall(stateName=name, updateValue=m.UpdateValue(
                        userKey=key, value=ser(vschema, (blob,))))
                f.write(_frame(m.StateRequest(stateVariableRequest=m.StateVariableRequest(
                    mapStateCall=call)).SerializeToString()))
            f.flush()
            for _ in window:
                status, error, _value = api._receive_proto_message()
                if status != 0:
                    raise _state_error("writing", name, error)
            self.exchanges += 1


def _frame(msg: bytes) -> bytes:
    """A request as the state server reads it: version 0, length, message (big-endian ints)."""
    return b"\x00\x00\x00\x00" + len(msg).to_bytes(4, "big") + msg


def _state_error(what: str, name: str, error: str) -> Exception:
    from pyspark.errors import PySparkRuntimeError

    return PySparkRuntimeError(f"batched engine: {what} map state {name!r} failed in Spark's state server: {error}")
