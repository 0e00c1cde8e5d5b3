"""Every scenario, sweep and file the docs and the help name exists (README, docs/, every --help): an
example that fails with "unknown scenario" is the first thing a new user runs."""

import re
from pathlib import Path

import pytest

from harness import cli
from harness.scenario.files import all_scenario_files, scenarios_in_file

ROOT = Path(__file__).resolve().parents[3]
# `pdchaos run NAME`, `pdchaos bisect NAME`: a lowercase word that is not the start of a path or file name.
_EXAMPLE = re.compile(r"pdchaos (?:run|bisect) (\S+)")
_WORD = re.compile(r"[a-z][a-z0-9_]*")


def _texts(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in files}
    parser = cli.build_parser()
    texts["pdchaos --help"] = parser.format_help()
    for command in cli.command_names():  # as a user sees it: some commands have parsers of their own
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        texts[f"pdchaos {command} --help"] = capsys.readouterr().out
    return texts


def _named(text: str) -> set[str]:
    names: set[str] = set()
    for line in text.splitlines():
        for m in _EXAMPLE.finditer(line):
            word = m.group(1).strip("`'\"")
            if _WORD.fullmatch(word) and not line[m.end(1):].startswith(("/", ".")):
                names.add(word)
    return names


def test_the_help_and_the_docs_name_only_known_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    known = {s.name for f in all_scenario_files() for s in scenarios_in_file(f)}
    named = {where: _named(text) for where, text in _texts(capsys).items()}
    for where in ("pdchaos --help", "pdchaos bisect --help", "README.md"):
        assert named[where], f"{where} names no scenario any more: update this test"
    unknown = {where: sorted(n - known) for where, n in named.items() if n - known}
    assert unknown == {}


@pytest.mark.parametrize("line", ["pdchaos run my_scenarios.py", "pdchaos run runs/x/found.py",
                                  "pdchaos run scenarios/engine_bugs.py --inject-bug X"])
def test_paths_are_not_taken_for_names(line: str) -> None:
    assert _named(line) == set()


def test_the_help_and_the_docs_name_only_shipped_sweeps(capsys: pytest.CaptureFixture[str]) -> None:
    shipped = {p.stem for p in (ROOT / "scenarios" / "sweeps").glob("*.toml")}
    named = {where: set(re.findall(r"pdchaos sweep ([a-z][a-z0-9_-]*)\b(?![./])", text))
             for where, text in _texts(capsys).items()}
    assert named["pdchaos sweep --help"], "the sweep help names no sweep any more: update this test"
    assert {where: sorted(n - shipped) for where, n in named.items() if n - shipped} == {}


_REPO_PATH = re.compile(
    r"\b(?:scenarios|examples|bench|harness|reference_router|fake_engines|reports|pdchaos|tests|docs)/"
    r"[A-Za-z0-9_./-]+\.(?:py|toml|md|yaml|json|txt)"
)


def test_the_files_the_docs_name_exist() -> None:
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    missing = {str(p.relative_to(ROOT)): sorted({m for m in _REPO_PATH.findall(p.read_text())
                                                 if not (ROOT / m).exists()}) for p in files}
    assert {where: names for where, names in missing.items() if names} == {}
