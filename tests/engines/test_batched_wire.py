"""The batched engine's windows of map-state requests (engines/batched/wire.py), against PySpark's
own client code talking to a stand-in of Spark's state server (no JVM): every answer reaches
the request it belongs to, across window edges, and a failed request raises."""

from __future__ import annotations

import pickle
import socket
import struct
import threading

import pytest

from sparkstate.engines.batched import wire
from sparkstate.engines.batched.layout import LEAF_KEY_SCHEMA, LEAF_VALUE_SCHEMA
from sparkstate.engines.batched.wire import LeafIO


class _Server:
    """Answers map-state getValue/updateValue/removeKey requests one by one, in order, as
    Spark's state server does; counts the requests and how many arrived before the previous
    answer was read (pipelined)."""

    def __init__(self, fail_key: int | None = None) -> None:
        self.store: dict[int, bytes] = {}
        self.requests = 0
        self.fail_key = fail_key
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        try:
            self._answer(conn.makefile("rwb"))
        except (ConnectionResetError, BrokenPipeError):
            pass  # the client hung up mid-conversation (a test whose request failed): nothing more to answer

    def _answer(self, f) -> None:
        import pyspark.sql.streaming.proto.StateMessage_pb2 as m

        while True:
            head = f.read(8)
            if len(head) < 8:
                return
            _version, n = struct.unpack("!ii", head)
            req = m.StateRequest()
            req.ParseFromString(f.read(n))
            call = req.stateVariableRequest.mapStateCall
            kind = call.WhichOneof("method")
            key = pickle.loads({"getValue": call.getValue, "updateValue": call.updateValue,
                                "removeKey": call.removeKey}[kind].userKey)[0]
            self.requests += 1
            if key == self.fail_key:
                resp = m.StateResponse(statusCode=1, errorMessage="disk on fire")
            elif kind == "getValue":
                blob = self.store.get(key)
                resp = m.StateResponse(statusCode=0, value=b"" if blob is None else pickle.dumps((blob,)))
            elif kind == "updateValue":
                self.store[key] = pickle.loads(call.updateValue.value)[0]
                resp = m.StateResponse(statusCode=0)
            else:
                self.store.pop(key, None)
                resp = m.StateResponse(statusCode=0)
            body = resp.SerializeToString()
            f.write(struct.pack("!i", len(body)) + body)
            f.flush()


def _leaf_io(server: _Server) -> LeafIO:
    from pyspark.sql.streaming.map_state_client import MapStateClient
    from pyspark.sql.streaming.stateful_processor import MapState
    from pyspark.sql.streaming.stateful_processor_api_client import StatefulProcessorApiClient

    api = StatefulProcessorApiClient(server.port, LEAF_KEY_SCHEMA)
    return LeafIO(MapState(MapStateClient(api, LEAF_KEY_SCHEMA, LEAF_VALUE_SCHEMA), "leaves"))


@pytest.mark.skipif(not wire.windows_supported(), reason="windows are used only on the PySpark releases checked for them")
def test_windows_of_reads_and_writes_match_each_answer_to_its_request():
    server = _Server()
    io = _leaf_io(server)
    assert io.pipelined
    n = wire.WRITE_WINDOW * 2 + 7  # several windows and a partial one
    blobs = [bytes([i % 251]) * (i * 37 % 5000) for i in range(n)]  # sizes from 0 to ~5 KB
    io.write_many([(lid, blobs[lid]) for lid in range(1, n)])
    assert server.store == {lid: blobs[lid] for lid in range(1, n)}
    io.write_many([(1, b"new")], removes=[2, 3])
    wanted = list(range(n + 5, 0, -1))  # reversed, with ids never stored
    got = io.get_many(wanted)
    expect = {**{lid: blobs[lid] for lid in range(4, n)}, 1: b"new"}
    assert got == [expect.get(lid) for lid in wanted]
    assert server.requests == (n - 1) + 3 + len(wanted)
    # one exchange per window, not one per request
    assert io.exchanges == -(-(n - 1) // wire.WRITE_WINDOW) + 1 + -(-len(wanted) // wire.READ_WINDOW)


@pytest.mark.skipif(not wire.windows_supported(), reason="windows are used only on the PySpark releases checked for them")
def test_a_failed_request_in_a_window_raises_with_the_servers_message():
    from pyspark.errors import PySparkRuntimeError

    server = _Server(fail_key=5)
    io = _leaf_io(server)
    with pytest.raises(PySparkRuntimeError, match="reading map state 'leaves' failed.*disk on fire"):
        io.get_many([1, 2, 5, 7])


class _MemoryMap:
    """A MapState with nothing of PySpark's client behind it (as in the tests' harness)."""

    def __init__(self) -> None:
        self.data: dict = {}

    def getValue(self, key):
        return self.data.get(key)

    def updateValue(self, key, value):
        self.data[key] = value

    def removeKey(self, key):
        self.data.pop(key, None)


def test_any_other_map_state_is_called_one_request_at_a_time():
    state = _MemoryMap()
    io = LeafIO(state)
    assert not io.pipelined
    io.write_many([(1, b"a"), (2, b"b"), (3, b"c")], removes=[9])
    io.write_many([], removes=[2])
    assert state.data == {(1,): (b"a",), (3,): (b"c",)}
    assert io.get_many([3, 2, 1]) == [b"c", None, b"a"]
