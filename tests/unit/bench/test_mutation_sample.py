"""The suite-judged sample of `bench/mutation.py`: ranked by seed and name, resumable across sittings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.bench_script import load_bench

suite = load_bench("mutation_suite")

NAMES = [("core/a.py", f"x_f__mutmut_{i}") for i in range(1, 41)]


def _results(path: Path, mutants: dict[str, dict[str, str]], seed: int = 3,
             presets: tuple[str, ...] = ("scaled", "production")) -> Path:
    path.write_text(json.dumps({"seed": seed, "presets": list(presets),
                                "cores": {"router": {"mutants": mutants}}}))
    return path


def test_a_sample_keeps_its_mutants_when_the_code_gains_or_loses_others() -> None:
    before = suite.seeded_sample(NAMES, 3, 10)
    grown = suite.seeded_sample([*NAMES, *(("core/b.py", f"x_g__mutmut_{i}") for i in range(1, 5))], 3, 10)
    shrunk = suite.seeded_sample(NAMES[5:], 3, 10)
    assert len(before) == 10 and len(set(before)) == 10
    # A new mutant may take a place, but every mutant kept is one the first sample had, in its order.
    assert [m for m in grown if m in NAMES] == before[: len([m for m in grown if m in NAMES])]
    assert [m for m in before if m in NAMES[5:]] == shrunk[: len([m for m in before if m in NAMES[5:]])]
    assert suite.seeded_sample(NAMES, 4, 10) != before


def test_resume_keeps_what_was_judged_of_this_sample_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = suite.seeded_sample(NAMES, 3, 5)
    judged = {sample[0][1]: {"suite": "fail"}, sample[1][1]: {"suite": "pass", "search": "pass"},
              "x_gone__mutmut_1": {"suite": "fail"}, sample[2][1]: {"path": "core/a.py"}}
    kept = suite.resumed(_results(tmp_path / "r.json", judged), "router", 3, ("scaled", "production"), sample)
    # A mutant recorded without a suite outcome (cut off mid-judging) is judged again.
    assert kept == {sample[0][1]: {"suite": "fail"}, sample[1][1]: {"suite": "pass", "search": "pass"}}
    assert "x_gone__mutmut_1" in capsys.readouterr().out


@pytest.mark.parametrize("seed, presets", [(4, ("scaled", "production")), (3, ("production",))])
def test_resume_refuses_another_sample(tmp_path: Path, seed: int, presets: tuple[str, ...]) -> None:
    path = _results(tmp_path / "r.json", {}, seed=seed, presets=presets)
    with pytest.raises(SystemExit, match="not seed 3 and presets scaled,production"):
        suite.resumed(path, "router", 3, ("scaled", "production"), suite.seeded_sample(NAMES, 3, 5))


@pytest.mark.parametrize("text", ["", "[]", "{\"cores\": {}}"])
def test_resume_refuses_what_is_not_a_results_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(SystemExit, match="not a --results file"):
        suite.resumed(path, "router", 3, ("scaled",), [])


def test_resume_of_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="not a --results file"):
        suite.resumed(tmp_path / "none.json", "router", 3, ("scaled",), [])


def test_a_name_that_now_stands_for_another_mutation_is_judged_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = suite.seeded_sample(NAMES, 3, 3)
    (_, a), (_, b), (_, c) = sample
    diff = ("-    def x_f__mutmut_orig(self):\n+    def x_f__mutmut_3(self):\n"
            "-        return x > 1\n+        return x >= 1\n")
    # The key leaves mutmut's names out: the same change under another number is the same mutation.
    assert suite.diff_key(diff) == suite.diff_key(diff.replace("mutmut_3", "mutmut_7"))
    assert suite.diff_key(diff) != suite.diff_key(diff.replace(">= 1", "> 2"))
    assert suite.diff_key(diff) == suite.diff_key(' """A docstring edited since."""\n' + diff), "context"
    judged = {a: {"suite": "fail", "diff_key": "aaaa"}, b: {"suite": "fail", "diff_key": "bbbb"},
              c: {"suite": "fail"}}
    keys = {a: "aaaa", b: "cccc", c: "dddd"}
    assert suite.renumbered(judged, keys) == [b]
    kept = suite.resumed(_results(tmp_path / "r.json", judged), "router", 3, ("scaled", "production"), sample,
                         keys)
    # b now names another mutation: judged again; c has no recorded key (an older file): kept as it is.
    assert set(kept) == {a, c}
    assert f"now another mutation: {b}" in capsys.readouterr().out
