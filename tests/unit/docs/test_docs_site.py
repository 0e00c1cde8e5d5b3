"""The docs site (mkdocs.yml) lists every page under docs/ and names no page that is missing, and the README
stays the short entry point it is meant to be. `mkdocs build --strict` runs too: the `test` extra installs
MkDocs and its theme, so CI builds the site as a reader gets it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"


def _nav_pages(nav: list[Any]) -> list[str]:
    pages: list[str] = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_the_nav_lists_every_page_and_only_pages_that_exist() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = _nav_pages(config["nav"])
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(listed) == on_disk
    assert len(set(listed)) == len(listed)


def test_the_readme_is_short_and_keeps_its_two_setup_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    commands = re.findall(r"^    (python3 -m venv .+)$", text, flags=re.M)
    assert len(commands) == 2, commands
    assert any(c.endswith("pdchaos run") for c in commands)
    assert any(c.endswith("pytest -q") for c in commands)


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_scenario_example_in_the_docs_loads_from_the_public_api(tmp_path: Path) -> None:
    """The first Python block of docs/scenarios.md, saved as a scenario file of a user's own, loads and
    validates: what it imports is public (`harness.scenario`, `harness.scenario.defaults`)."""
    from harness.scenario import validate
    from harness.scenario.files import scenarios_in_file

    text = (DOCS / "scenarios.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", text, flags=re.S)
    assert block is not None
    source = block.group(1)
    assert "scenarios." not in source, "the example imports a private module"
    path = tmp_path / "my_scenarios.py"
    path.write_text(source, encoding="utf-8")
    (found,) = scenarios_in_file(path)
    validate(found)
    assert found.name == "prefill_restart_mooncake" and found.expect
