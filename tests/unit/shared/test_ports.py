import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pdchaos.port_claims import CLAIMS_DIR_ENV, _claimant
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


# A process drawing ports from a 16-port pool: prints the ports it got, then waits for a line on stdin
# (holding them) before it exits. With FORK set, a forked child exits first (running its exit handlers).
_DRAWER = """
import os, sys
from pdchaos.ports import free_ports
got = free_ports(int(sys.argv[1]))
if os.environ.get("FORK"):
    pid = os.fork()
    if pid == 0:
        sys.exit(0)
    os.waitpid(pid, 0)
print(" ".join(map(str, got)), flush=True)
sys.stdin.readline()
"""
POOL = "23100-23115"


def _drawer(claims: Path, n: int, **env: str) -> tuple[subprocess.Popen[str], set[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _DRAWER, str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, POOL_ENV: POOL, CLAIMS_DIR_ENV: str(claims), **env},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the drawer died"
    return proc, {int(p) for p in line.split()}


def _finish(proc: subprocess.Popen[str]) -> None:
    proc.communicate("\n", timeout=10)
    assert proc.returncode == 0


def _claim_files(claims: Path) -> dict[int, int]:
    return {int(p.name): int(p.read_text().split()[0]) for p in claims.iterdir() if p.name.isdigit()}


def test_runs_side_by_side_never_draw_the_same_port(tmp_path: Path) -> None:
    # Two independent draws of 8 from 16 ports are disjoint once in 12,870 times: without the claims this
    # fails.
    first, got_first = _drawer(tmp_path, 8)
    try:
        assert _claim_files(tmp_path) == dict.fromkeys(got_first, first.pid)
        second, got_second = _drawer(tmp_path, 8)
        _finish(second)
    finally:
        _finish(first)
    assert got_first.isdisjoint(got_second)
    assert got_first | got_second == set(range(23100, 23116))
    assert _claim_files(tmp_path) == {}  # each gave its claims up when it exited


def test_a_live_process_s_claim_is_skipped_and_a_gone_one_s_is_taken_over(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    me = _claimant(os.getpid())
    owners = {
        **dict.fromkeys(range(23100, 23106), me),  # live: kept
        **dict.fromkeys(range(23106, 23108), str(os.getpid())),  # live, written without a start time: kept
        **dict.fromkeys(range(23108, 23112), gone.stdout.strip()),  # exited
        # this process's pid with another start time: a process that had the pid before this one
        **dict.fromkeys(range(23112, 23116), f"{os.getpid()} 1"),
    }
    held = set(range(23100, 23108))
    for port, owner in owners.items():
        (tmp_path / str(port)).write_text(owner)
    proc, got = _drawer(tmp_path, 8)
    try:
        assert got == set(range(23108, 23116))
        assert _claim_files(tmp_path) == {**dict.fromkeys(held, os.getpid()), **dict.fromkeys(got, proc.pid)}
    finally:
        _finish(proc)
    assert _claim_files(tmp_path) == dict.fromkeys(held, os.getpid())  # others' claims are left alone


def test_a_forked_child_leaves_its_parent_s_claims_in_place(tmp_path: Path) -> None:
    proc, got = _drawer(tmp_path, 4, FORK="1")  # the child has exited before the ports are printed
    try:
        assert _claim_files(tmp_path) == dict.fromkeys(got, proc.pid)
    finally:
        _finish(proc)


def test_an_unusable_claims_folder_leaves_a_process_its_own_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setenv(CLAIMS_DIR_ENV, str(not_a_folder / "claims"))
    monkeypatch.setenv(POOL_ENV, "23200-23299")
    ports = free_ports(10)
    assert len(set(ports)) == 10 and all(23200 <= p <= 23299 for p in ports)
