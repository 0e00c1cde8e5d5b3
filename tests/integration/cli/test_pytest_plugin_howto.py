"""The how-to docs/howto/use-the-pytest-plugin.md: its test file (examples/pytest/test_my_cluster.py) is
shown as it is, uses only what the `pd_cluster` fixture and marker offer, and passes when pytest runs it in a
project of its own (a folder with its own pytest.ini, the plugin found through its `pytest11` entry point).

The last test starts processes (a pytest subprocess, which brings up a 1p1d cluster on loopback: about 3 s);
the guide's claim is that this works, so only running it checks it."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from harness.pd_cluster import ClusterConfig, PDCluster

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "pytest" / "test_my_cluster.py"
GUIDE = ROOT / "docs" / "howto" / "use-the-pytest-plugin.md"


def test_the_guide_shows_the_example_as_it_is() -> None:
    assert EXAMPLE.read_text(encoding="utf-8") in GUIDE.read_text(encoding="utf-8")


def test_the_example_uses_only_what_the_fixture_and_marker_offer() -> None:
    tree = ast.parse(EXAMPLE.read_text(encoding="utf-8"))
    used = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "pd_cluster"}
    assert used, "the example no longer uses the fixture"
    assert sorted(a for a in used if not hasattr(PDCluster, a)) == []
    options = {kw.arg for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == "pd_cluster" for kw in n.keywords}
    assert options and options <= set(ClusterConfig.__dataclass_fields__)


def test_pytest_runs_the_example_in_a_project_of_its_own(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(EXAMPLE, project / EXAMPLE.name)
    (project / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "tmp"),
         EXAMPLE.name],
        cwd=project, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
