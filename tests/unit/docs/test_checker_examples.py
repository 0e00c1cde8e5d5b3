"""The checker reference's examples are what the checkers print on the runs they name
(harness.checker_examples)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.checker_examples import (
    EXAMPLES_JSON,
    GATEWAY_SOURCES,
    ZOO_JSON,
    Source,
    load_examples,
    main,
    replay,
    sources,
)
from harness.checkers import CHECKERS

# A small cell (1p1d, the #2491 scenario at production settings): a few seconds in simulation.
REPLAYED = "reported_engine_id"


def _zoo() -> dict:
    return json.loads(ZOO_JSON.read_text(encoding="utf-8"))


def test_every_checker_a_switch_or_gateway_trips_has_its_example() -> None:
    examples = load_examples()
    assert set(examples) <= set(CHECKERS)
    missing = sorted(set(sources(_zoo())) - set(examples))
    assert not missing, f"run: python -m harness.checker_examples --only {' '.join(missing)}"


def test_each_simulated_example_is_a_cell_the_stored_zoo_matrix_says_fails_its_checker() -> None:
    caught = {(cell["replay"], checker)
              for entry in _zoo()["switches"].values() for cell in entry["cells"].values() if cell["caught"]
              for checker in cell["checkers"]}
    for name, example in load_examples().items():
        if example["source"] == "gateway":
            assert example["replay"] == GATEWAY_SOURCES[name]
            continue
        assert (example["replay"], name) in caught, name
        assert example["reason"] and example["evidence"], name


def test_a_replayed_example_prints_what_the_page_shows(tmp_path: Path) -> None:
    stored = load_examples()[REPLAYED]
    again = replay(Source(REPLAYED, stored["replay"], stored["source"]), tmp_path / "example")
    assert again == stored, "run: python -m harness.checker_examples, then python -m harness.docs_reference"


def test_a_source_that_does_not_fail_its_checker_is_refused(tmp_path: Path) -> None:
    line = load_examples()[REPLAYED]["replay"].split(" --inject-bug")[0]  # the same cell, no bug
    with pytest.raises(RuntimeError, match="did not fail it \\(pass\\)"):
        replay(Source(REPLAYED, line, "switch none"), tmp_path / "example")


def test_only_a_pdchaos_run_line_is_replayed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a `pdchaos run` line"):
        replay(Source("balance", "pdchaos zoo --bug shared_policy", "switch shared_policy"), tmp_path)


def test_an_unknown_checker_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    before = EXAMPLES_JSON.read_bytes()
    with pytest.raises(SystemExit) as exc:
        main(["--only", "no_such_checker"])
    assert exc.value.code == 2
    assert "no such checker: no_such_checker" in capsys.readouterr().err
    assert EXAMPLES_JSON.read_bytes() == before
