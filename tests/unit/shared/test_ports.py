import socket

from pdchaos.ports import LOOPBACK, _ephemeral_range, free_port, free_ports, port_is_open


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    lo, hi = _ephemeral_range()
    assert all(not (lo <= p <= hi) for p in ports)
    for p in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((LOOPBACK, p))


def test_port_is_open_tells_listening_from_closed() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, free_port()))
        s.listen()
        port = s.getsockname()[1]
        assert port_is_open(port)
    assert not port_is_open(port)
