"""`pdchaos zoo`: the switch list, bad arguments (exit 3), a small detection matrix in simulated time and
rebuilding it from the cell histories (`--rejudge`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli
from harness.scenario.bugs import SWITCHES


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_list_names_every_switch_with_its_side_and_reference(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _main(capsys, "zoo", "--list")
    assert code == 0
    for name, sw in SWITCHES.items():
        assert f"{name}  [{sw.side}, {sw.zoo};" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["zoo", "--bug", "no_such_bug"], "unknown bug no_such_bug"),
        (["zoo", "no_such_scenario"], "unknown scenario 'no_such_scenario'"),
        (["zoo", "--baseline-runs", "0"], "--baseline-runs must be at least 1"),
        (["zoo", "--rejudge", "/nonexistent/zoo"], "/nonexistent/zoo"),
    ],
)
def test_bad_arguments_exit_3_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code, _, err = _main(capsys, *argv)
    assert code == 3 and needle in err and "Traceback" not in err


def test_a_small_zoo_catches_its_switches_and_can_be_rejudged(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "zoo"
    code, text, err = _main(
        capsys, "zoo", "sole_prefill_down", "--bug", "no_worker_404", "--bug", "prefill_on_decode",
        "--topology", "1p1d", "--connector", "mooncake", "--transport", "http", "--settings", "scaled",
        "--jobs", "1", "--no-progress", "--out", str(out),
    )
    assert code == 0, text + err
    m = json.loads((out / "zoo.json").read_text())
    assert m["ok"] and m["world"] == "sim" and m["settings"] == "scaled"
    key = "sole_prefill_down[1p1d/mooncake/http]"
    assert m["switches"]["no_worker_404"]["cells"][key]["checkers"] == ["prompt_503"]
    assert "404" in m["switches"]["no_worker_404"]["cells"][key]["evidence"]
    assert "no_local_compute" in m["switches"]["prefill_on_decode"]["cells"][key]["checkers"]
    assert "| no_worker_404 | router | zoo-8 |" in (out / "zoo.md").read_text()
    # The same matrix again from the histories alone.
    (out / "zoo.json").unlink()
    code, _, err = _main(capsys, "zoo", "--rejudge", str(out))
    assert code == 0, err
    again = json.loads((out / "zoo.json").read_text())
    assert again["switches"]["no_worker_404"]["caught_by"] == [key]
    replay = again["switches"]["no_worker_404"]["cells"][key]["replay"]
    assert replay.startswith("pdchaos run sole_prefill_down")
    # A cell an interruption cut short (its history has no verdict beside it) runs again on --resume.
    cut = next(p.parent for p in (out / "cells").rglob("result.json"))
    (cut / "result.json").unlink()
    history = cut / "history.jsonl"
    history.write_text("".join(ln for ln in history.read_text().splitlines(keepends=True)
                               if '"type":"run_ended"' not in ln))
    # Judged as it stands: unknown (exit 2), the run not judged counted, never a pass.
    code, text, _ = _main(capsys, "zoo", "--rejudge", str(out))
    partial = json.loads((out / "zoo.json").read_text())
    assert code == 2 and partial["unjudged"] == 1 and not partial["ok"] and "UNKNOWN: interrupted" in text
    code, _, err = _main(capsys, "zoo", "--resume", str(out), "--no-progress")
    assert code == 0, err
    assert "running 1" in err and (cut / "result.json").is_file()
    assert json.loads((out / "zoo.json").read_text())["unjudged"] == 0
    assert '"type":"run_ended"' in history.read_text()
    # A folder from before the runner saved results: finished histories alone count as judged.
    for saved in (out / "cells").rglob("result.json"):
        saved.unlink()
    code, _, err = _main(capsys, "zoo", "--rejudge", str(out))
    assert code == 0, err
    assert json.loads((out / "zoo.json").read_text())["unjudged"] == 0
    code, _, err = _main(capsys, "zoo", "--resume", str(out), "--no-progress")
    assert code == 0 and "running 0" in err
    # A plan whose seed is no seed: one line, nothing run.
    plan = json.loads((out / "plan.json").read_text())
    (out / "plan.json").write_text(json.dumps({**plan, "seed": -4}))
    code, _, err = _main(capsys, "zoo", "--resume", str(out), "--no-progress")
    assert code == 3 and "a seed is a whole number" in err
