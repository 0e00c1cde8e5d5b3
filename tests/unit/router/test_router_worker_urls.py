"""Which worker URLs the router takes (issue 16): loopback only unless allow-listed, never itself, never
with credentials; one engine spelled two ways is one engine."""

from __future__ import annotations

import pytest

from reference_router.cli import build_parser, config_from_args
from reference_router.core.worker_urls import endpoint, same_engine, url_problem


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("http://10.0.0.1:8000", "not a loopback"),
        ("http://169.254.169.254", "not a loopback"),
        ("grpc://example.com:50051", "not a loopback"),
        ("http://0.0.0.0:8000", "not a loopback"),
        ("http://[::]:8000", "not a loopback"),
        ("http://a:b@127.0.0.1:8000", "credentials"),
        ("http://a@127.0.0.1:8000", "credentials"),
        ("http://127.0.0.1:9000", "this router itself"),
        ("http://localhost:9000", "this router itself"),
        ("grpc://[::1]:9000", "this router itself"),
    ],
)
def test_refused(url: str, needle: str) -> None:
    problem = url_problem(url, 9000)
    assert problem is not None and needle in problem


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "grpc://localhost:50051", "http://[::1]:80",
                                 "http://127.0.0.5:8000"])
def test_loopback_workers_are_fine(url: str) -> None:
    assert url_problem(url, 9000) is None


def test_allow_list_names_other_hosts_exactly() -> None:
    assert url_problem("http://10.0.0.1:8000", 9000, ["10.0.0.1"]) is None
    assert url_problem("http://Gpu-Box:8000", 9000, ["gpu-box"]) is None
    assert url_problem("http://10.0.0.2:8000", 9000, ["10.0.0.1"]) is not None
    # Credentials stay refused whatever the host.
    assert url_problem("http://u:p@10.0.0.1:8000", 9000, ["10.0.0.1"]) is not None


def test_same_engine_folds_spellings() -> None:
    assert same_engine("http://localhost:8000", "http://127.0.0.1:8000/")
    assert same_engine("HTTP://LOCALHOST:8000", "http://127.0.0.1:8000")
    assert not same_engine("http://127.0.0.1:8000", "grpc://127.0.0.1:8000")
    assert not same_engine("http://127.0.0.1:8000", "http://127.0.0.1:8001")
    assert endpoint("not a url") is None


def test_command_line_urls_pass_the_same_rules() -> None:
    base = ["--pd-disaggregation", "--decode", "http://127.0.0.1:8200"]
    cfg = config_from_args(build_parser().parse_args([*base, "--prefill", "http://10.1.1.1:8100"]))
    with pytest.raises(ValueError, match="not a loopback"):
        cfg.validate()
    ok = config_from_args(build_parser().parse_args(
        [*base, "--prefill", "http://10.1.1.1:8100", "--allow-worker-host", "10.1.1.1"]))
    ok.validate()
    own = config_from_args(build_parser().parse_args([*base, "--port", "8200"]))
    with pytest.raises(ValueError, match="this router itself"):
        own.validate()
