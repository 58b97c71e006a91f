"""tests/ports.py, the suite's one port helper: no port twice, none held by someone else, none
in the kernel's ephemeral range, and a bind that loses its port is retried on a fresh one."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import pytest
import zmq

from tests.ports import (
    PortPool,
    bind_retrying,
    candidate_ranges,
    ephemeral_range,
    free_port,
    free_port_pair,
    free_port_run,
    listening_socket,
    lost_its_port,
)


def test_no_port_is_handed_out_twice_in_a_process() -> None:
    ports = [free_port() for _ in range(300)]
    for _ in range(50):
        pair, run = free_port_pair(), free_port_run(3)
        ports += [pair, pair + 1, run, run + 1, run + 2]
    assert len(ports) == len(set(ports))


def test_ports_lie_outside_the_ephemeral_range() -> None:
    first, last = ephemeral_range()
    ports = [free_port() for _ in range(100)] + [free_port_pair() + 1 for _ in range(20)]
    assert not [p for p in ports if first <= p <= last]


def test_a_port_bound_by_someone_else_is_not_handed_out() -> None:
    base = free_port_run(5)
    with socket.create_server(("127.0.0.1", base + 2)):
        pool = PortPool([range(base, base + 5)], seed=0)
        got = {pool.take() for _ in range(4)}
        assert got == {base, base + 1, base + 3, base + 4}
        with pytest.raises(RuntimeError, match="no run of 1 free ports"):
            pool.take()


def test_a_run_stays_inside_one_range() -> None:
    low, high = free_port_run(2), free_port_run(3)
    pool = PortPool([range(low, low + 2), range(high, high + 3)], seed=1)
    assert pool.take(3) == high  # low .. low + 2 would cross out of its range
    with pytest.raises(RuntimeError):
        pool.take(3)


def test_candidate_ranges_leave_the_ephemeral_range_out(tmp_path: Path) -> None:
    conf = tmp_path / "ip_local_port_range"
    conf.write_text("32768\t60999\n")
    assert ephemeral_range(conf) == (32768, 60999)
    assert candidate_ranges((32768, 60999)) == [range(10000, 32768), range(61000, 65536)]
    assert candidate_ranges((1024, 65535)) == [range(10000, 65536)]  # no room: everything
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)


def test_a_bind_that_loses_its_port_is_retried_on_a_fresh_one() -> None:
    """Another process binds the port between the helper's probe and our bind: the real
    EADDRINUSE, from a socket and from zmq, then a second port that works."""
    ctx = zmq.Context()
    thief: list[socket.socket] = []
    tried: list[int] = []

    def bind(port: int) -> zmq.Socket[bytes]:
        tried.append(port)
        if not thief:
            thief.append(socket.create_server(("127.0.0.1", port)))
        sock = ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(f"tcp://127.0.0.1:{port}")
        except zmq.ZMQError:
            sock.close()
            raise
        return sock

    try:
        pub = bind_retrying(bind)
        assert len(tried) == 2 and tried[0] != tried[1]
        assert pub.getsockopt(zmq.LAST_ENDPOINT) == f"tcp://127.0.0.1:{tried[1]}".encode()
        pub.close()
        listener = bind_retrying(listening_socket)
        assert listener.getsockname()[0] == "127.0.0.1"
        listener.close()
    finally:
        for s in thief:
            s.close()
        ctx.destroy(linger=0)


def test_other_bind_errors_are_not_retried() -> None:
    tried: list[int] = []

    def bind(port: int) -> None:
        tried.append(port)
        raise OSError(errno.EACCES, "permission denied")

    with pytest.raises(OSError, match="permission denied"):
        bind_retrying(bind)
    assert len(tried) == 1


def test_a_child_that_lost_its_port_is_recognised_by_its_log() -> None:
    uvicorn = "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 1)"
    assert lost_its_port("INFO: loading\n" + uvicorn + ": address already in use\n")
    assert lost_its_port("zmq.error.ZMQError: Address already in use (addr='tcp://*:5')")
    assert not lost_its_port("RuntimeError: out of memory\n")
