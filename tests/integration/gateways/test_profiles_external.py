"""Gateway profiles against their real releases (`harness.profile_check`).

The stored table (tests/data/profiles.json) is checked on every run: every profile has been compared with its
release, on every cell `profile_check` chooses for it, and no checker disagrees. With PDCHAOS_EXTERNAL=1 one
profile is compared again with its real release (PyPI needed on first use: the release is installed into the
gateway cache).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from harness.profile_check import (
    EXPLAINED,
    TABLE,
    UNSETTLED,
    cells_for,
    check_profile,
    compare,
    disagreements,
    judged_row,
    majority,
    merged,
    settled,
    stored_reference,
    stored_runs,
)
from harness.routers.profiles import PROFILES
from harness.scenario import load_scenarios


def _table() -> dict:
    return json.loads(TABLE.read_text(encoding="utf-8"))


def test_every_profile_was_compared_with_its_release_on_every_cell() -> None:
    table = _table()
    scenarios = {s.name: s.suite_cut() for s in load_scenarios()}
    assert sorted(table) == sorted(PROFILES)
    for name, profile in PROFILES.items():
        entry = table[name]
        assert entry["release"] == profile.release
        rerun = f"{name}: rerun python -m harness.profile_check --profile {name}"
        assert sorted(entry["bugs"]) == sorted(profile.bugs), rerun
        assert set(entry["cells"]) == {c.key for c in cells_for(profile, scenarios)}, rerun


def test_no_profile_disagrees_with_its_release_but_where_explained() -> None:
    table = _table()
    assert disagreements(table, EXPLAINED) == []
    gone = set(EXPLAINED) - {line.split(":")[0] for line in disagreements(table)}
    assert not gone, f"these agree now: drop them from EXPLAINED: {sorted(gone)}"
    assert all(why.strip() for why in EXPLAINED.values())


def test_the_stored_table_is_judged_by_todays_rule() -> None:
    """Each stored row is what its stored runs give (majorities, races, agreement), so a change to the
    rule cannot leave an old judgement standing."""
    for name, entry in _table().items():
        for key, row in entry["cells"].items():
            runs = stored_runs(row, "release"), stored_runs(row, "profile")
            again = judged_row(stored_reference(row), *runs, entry["repeat"])
            assert again == row, f"{name} {key}: rerun or rejudge the table"


def test_each_profile_differs_from_the_reference_somewhere_the_release_does() -> None:
    """A profile that agrees only because nothing differs would prove nothing: each release differs from
    the reference router on at least one compared checker, and the profile agrees there."""
    for name, entry in _table().items():
        differing = [(key, checker) for key, row in entry["cells"].items()
                     for checker, c in row["checkers"].items() if c["release_differs"] and c["agrees"]]
        assert differing, f"{name}: no cell where the release differs from the reference"


def test_compare_marks_disagreement_and_missing_evidence() -> None:
    out = compare({"a": "fail", "b": "unknown", "c": "pass"}, {"a": "pass", "b": "fail", "c": "pass"},
                  {"a": "pass", "b": "pass", "c": "pass"})
    assert out["a"]["agrees"] is False and out["a"]["release_differs"] is True
    assert out["b"]["agrees"] is None  # the release gave no evidence: nothing to compare
    assert out["c"]["agrees"] is True and out["c"]["release_differs"] is False
    table = {"p": {"cells": {"k": {"checkers": out}}}}
    assert disagreements(table) == ["p k a: release fail, profile pass"]
    assert disagreements(table, {"p k a": "known"}) == []


def test_majority_of_repeated_runs_and_when_a_side_may_stop() -> None:
    two_fail = [{"recovery": "fail", "output": "pass"}, {"recovery": "fail", "output": "pass"}]
    assert settled(two_fail, 3) and majority(two_fail, 3) == {"output": "pass", "recovery": "fail"}
    split = [{"recovery": "fail"}, {"recovery": "pass"}]
    assert not settled(split, 3) and majority(split, 3) == {"recovery": UNSETTLED}
    assert majority([*split, {"recovery": "fail"}], 3) == {"recovery": "fail"}
    # No majority among three different outcomes; a checker missing from a run counts as unknown there.
    assert majority([*split, {"recovery": "unknown"}], 3) == {"recovery": UNSETTLED}
    assert majority([{"a": "pass"}, {"a": "pass", "b": "fail"}], 3) == {"a": "pass", "b": UNSETTLED}
    assert settled([{"a": "pass"}], 1) and majority([{"a": "fail"}], 1) == {"a": "fail"}
    # An unsettled side is not compared (no evidence either way), never counted as agreeing or not.
    assert compare({"a": UNSETTLED}, {"a": "pass"}, {"a": "pass"})["a"]["agrees"] is None


def test_a_race_agrees_where_the_profile_gave_a_verdict_the_release_gave() -> None:
    reference = {"recovery": "pass"}
    # The release split (fail twice, pass once): a profile that passes gave one of its outcomes.
    split = [{"recovery": "fail"}, {"recovery": "pass"}, {"recovery": "fail"}]
    row = judged_row(reference, split, [{"recovery": "pass"}, {"recovery": "pass"}], 3)
    c = row["checkers"]["recovery"]
    assert c["race"] and c["agrees"] is True and c["release"] == "fail" and c["profile"] == "pass"
    # Both steady and different: a disagreement, race or not elsewhere.
    steady = judged_row(reference, [{"recovery": "pass"}] * 2, [{"recovery": "fail"}] * 2, 3)
    assert steady["checkers"]["recovery"]["agrees"] is False and not steady["checkers"]["recovery"]["race"]
    # A profile that splits where the release never passed still overlaps on fail.
    assert judged_row(reference, [{"recovery": "fail"}] * 2, split)["checkers"]["recovery"]["agrees"] is True
    # Only unknown on one side: nothing to compare, even in a race.
    unknown = judged_row(reference, split, [{"recovery": "unknown"}] * 2)
    assert unknown["checkers"]["recovery"]["agrees"] is None and unknown["agrees"] is True
    assert stored_runs(row, "release") == split and stored_reference(row) == reference


def test_accumulated_runs_judge_a_cell_on_all_its_runs() -> None:
    reference = {"recovery": "pass"}
    first = judged_row(reference, [{"recovery": "pass"}] * 2, [{"recovery": "fail"}] * 2, 3)
    second = judged_row(reference, [{"recovery": "fail"}, {"recovery": "pass"}, {"recovery": "pass"}],
                        [{"recovery": "fail"}] * 2, 3)
    old = {"release": "smg==1.11.0", "bugs": ["x"], "cells": {"k": first, "other": first}}
    new = {"release": "smg==1.11.0", "bugs": ["x"], "cells": {"k": second}}
    assert merged(old, new)["cells"]["k"] == second  # replaced: judged on the new runs only
    both = merged(old, new, accumulate=True)["cells"]
    assert both["other"] == first
    c = both["k"]["checkers"]["recovery"]
    assert c["release_runs"] == ["pass", "pass", "fail", "pass", "pass"] and c["profile_runs"] == ["fail"] * 4
    assert c["release"] == "pass" and c["race"] and c["agrees"] is True
    # Other switches: nothing is added to runs of another profile.
    other = {"release": "smg==1.11.0", "bugs": ["y"], "cells": {"k": second}}
    assert merged(old, other, accumulate=True)["cells"] == {"k": second}


def test_a_partial_rerun_keeps_the_other_cells_of_an_unchanged_profile() -> None:
    old = {"release": "smg==1.13.0", "bugs": ["x"], "cells": {"a": 1, "b": 2}}
    assert merged(old, {"release": "smg==1.13.0", "bugs": ["x"], "cells": {"b": 3}})["cells"] == {
        "a": 1, "b": 3}
    # Changed switches: the old cells judged another profile.
    assert merged(old, {"release": "smg==1.13.0", "bugs": ["x", "y"], "cells": {"b": 3}})["cells"] == {
        "b": 3}
    assert merged(None, {"release": "r", "bugs": [], "cells": {}})["cells"] == {}


@pytest.mark.external
@pytest.mark.skipif(os.environ.get("PDCHAOS_EXTERNAL") != "1",
                    reason="external gateway test: PDCHAOS_EXTERNAL=1")
def test_profile_agrees_with_its_release_when_rerun(tmp_path: Path) -> None:
    name = os.environ.get("PDCHAOS_PROFILE", "smg-1.13.0")
    result = asyncio.run(check_profile(PROFILES[name], tmp_path, only=("sole_prefill_down",)))
    assert result["cells"], "no cell ran"
    assert disagreements({name: result}) == []
