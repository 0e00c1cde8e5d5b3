import socket

import pytest

from pdchaos.ports import (
    LOOPBACK,
    POOL_ENV,
    _ephemeral_range,
    free_port,
    free_ports,
    pool_from_env,
    port_is_open,
)


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


def test_a_process_can_be_given_its_own_port_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POOL_ENV, "23000-23099")
    ports = free_ports(30)
    assert len(set(ports)) == 30
    assert all(23000 <= p <= 23099 for p in ports)


@pytest.mark.parametrize(
    "bad", ["x", "23000", "100-200", "23000-23010", "30000-20000", "60000-70000", "1-2-3"]
)
def test_a_bad_port_pool_is_refused_with_the_form_it_needs(bad: str) -> None:
    with pytest.raises(ValueError, match=POOL_ENV):
        pool_from_env(bad)


def test_no_port_pool_named_means_the_default_one() -> None:
    assert pool_from_env(None) is None
    assert pool_from_env("  ") is None
    assert pool_from_env(" 20000-20015 ") == (20000, 20015)
