"""bench/router_overhead.py: the ratios to the fastest, the table and the reference-vs-gateway lines (pure
formatting; nothing is started or timed)."""

from __future__ import annotations

import pytest
from helpers.bench_script import load_bench

ro = load_bench("router_overhead")


def cell(router: str, transport: str, p50: float | None, p99: float | None, rps: float | None,
         na: str | None = None, errors: int = 0) -> object:
    return ro.Cell(router, transport, added_p50_ms=p50, added_p99_ms=p99, rps=rps, na=na, errors=errors)


def test_latency_ratios_are_multiples_of_the_lowest() -> None:
    assert ro.ratios([2.0, 1.0, None, 4.0], lower_is_better=True) == [2.0, 1.0, None, 4.0]


def test_throughput_ratios_are_how_many_times_slower_than_the_highest() -> None:
    assert ro.ratios([100.0, 50.0, None], lower_is_better=False) == [1.0, 2.0, None]


@pytest.mark.parametrize("values", [[-0.1, 1.0], [0.0, 2.0], [None, None], []])
def test_no_ratio_when_the_best_is_not_positive_or_missing(values: list[float | None]) -> None:
    assert ro.ratios(values, lower_is_better=True) == [None] * len(values)


def test_table_rows_ratios_and_na_footnotes() -> None:
    cells = [
        cell("reference", "http", 2.0, 3.0, 500.0),
        cell("smg-1.13.0", "http", 1.0, 1.5, 1000.0, errors=2),
        cell("vllm-router-0.1.17", "grpc", None, None, None, na="no gRPC workers"),
    ]
    lines = ro.format_table(cells).splitlines()
    assert lines[0].split() == ["router", "transport", "added", "p50", "ms", "added", "p99", "ms", "req/s"]
    ref = next(ln for ln in lines if ln.startswith("reference"))
    assert "2.000 (x2.00)" in ref and "3.000 (x2.00)" in ref and "500.0 (x2.00)" in ref
    smg = next(ln for ln in lines if ln.startswith("smg-1.13.0"))
    assert "1.000 (x1.00)" in smg and "1000.0 (x1.00) [1]" in smg
    vllm = next(ln for ln in lines if ln.startswith("vllm-router"))
    assert vllm.split()[2:] == ["n/a", "[2]"] * 3
    assert "[1] smg-1.13.0 http: 2 errors at saturation" in lines
    assert "[2] vllm-router-0.1.17 grpc: no gRPC workers" in lines


def test_columns_line_up() -> None:
    lines = ro.format_table([cell("reference", "http", 12.5, 30.0, 99.0),
                             cell("smg", "grpc", 0.5, 1.0, 12345.6)]).splitlines()
    assert len({len(ln) for ln in lines[:4]}) == 1


def test_a_negative_added_latency_shows_without_a_ratio() -> None:
    table = ro.format_table([cell("reference", "http", 1.0, -0.2, 10.0), cell("smg", "http", 0.5, 0.3, 20.0)])
    assert "-0.200 (x-)" in table and "0.300 (x-)" in table


def test_reference_against_each_gateway_per_transport() -> None:
    cells = [
        cell("reference", "http", 2.0, 3.0, 500.0),
        cell("smg-1.13.0", "http", 1.0, 1.5, 1000.0),
        cell("reference", "grpc", 4.0, 5.0, 300.0),
        cell("smg-1.13.0", "grpc", None, None, None, na="failed: boom"),
    ]
    assert ro.comparisons(cells) == [
        "reference vs smg-1.13.0 [http]: added p50 2.000 vs 1.000 ms (x2.00), req/s 500 vs 1000 (x0.50)"
    ]
