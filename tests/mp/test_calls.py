"""Typed calls (`_calls`) over a real connection: each role serves its own, names the rest."""

from __future__ import annotations

import pickle

import pytest

from fiberexec.multiprocessing import _calls as calls
from fiberexec.multiprocessing._broker import get_broker
from fiberexec.multiprocessing._managers import _Server
from fiberexec.multiprocessing._rpc import RpcClient


def test_a_broker_serves_queue_calls_over_a_connection() -> None:
    broker = get_broker()
    client = RpcClient(broker.address, broker.secret, timeout=10)
    try:
        assert client.call(calls.Ping()) == (None, b"")  # answered by the transport
        cid, _ = client.call(calls.NewChan(0, -1))
        assert client.call(calls.Put(cid, 0.0), pickle.dumps("item"))[0] == "ok"
        assert client.call(calls.QSize(cid))[0] == (1, 0)
        status, body = client.call(calls.Get(cid, 1.0), timeout=10)
        assert (status, pickle.loads(body)) == ("ok", "item")
        assert client.call(calls.Get(cid, 0.0))[0] == "empty"
    finally:
        client.close()


def test_a_call_a_role_does_not_serve_is_refused_by_name() -> None:
    broker = get_broker()
    client = RpcClient(broker.address, broker.secret, timeout=10)
    try:
        with pytest.raises(ValueError, match=r"a broker does not serve Count\(\)"):
            client.call(calls.Count())  # a manager's call
        assert client.call(calls.Ping()) == (None, b"")  # the connection lives on
    finally:
        client.close()
    with pytest.raises(ValueError, match=r"a manager's server does not serve Get\(cid=1"):
        _Server({}).handle(calls.Get(1, 0.0), b"", ("token", 0))


def test_calls_are_frozen_and_compare_by_value() -> None:
    call = calls.CallObject(3, "acquire", (True, 1.0))
    assert pickle.loads(pickle.dumps(call)) == call
    with pytest.raises(AttributeError):
        call.oid = 4  # type: ignore[misc]
