"""Bad bundles get one clear line; cut, foreign and interleaved content is read as far as it goes."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from harness.incident.bundle import read_bundle
from harness.incident.facts import IncidentError
from harness.incident.infer import infer

pytestmark = pytest.mark.unit

BUNDLES = Path(__file__).resolve().parents[2] / "data" / "incidents"


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(IncidentError, match="empty, no files"):
        read_bundle([tmp_path])


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(IncidentError, match="no such file"):
        read_bundle([tmp_path / "nope"])


def test_log_of_another_program(tmp_path: Path) -> None:
    (tmp_path / "nginx.log").write_text(
        '127.0.0.1 - - [06/Dec/2026:09:30:46 +0000] "GET / HTTP/1.1" 200 612\n'
    )
    with pytest.raises(IncidentError, match=r"nginx.log: not a log this reads"):
        read_bundle([tmp_path])


def test_binary_garbage(tmp_path: Path) -> None:
    (tmp_path / "core").write_bytes(bytes(range(256)) * 64)
    with pytest.raises(IncidentError, match="core: binary"):
        read_bundle([tmp_path])


def test_truncated_json_events_alone(tmp_path: Path) -> None:
    text = json.dumps({"kind": "EventList", "items": [{"kind": "Event", "reason": "Killing"}]})
    (tmp_path / "events.json").write_text(text[: len(text) // 2])
    with pytest.raises(IncidentError) as e:
        read_bundle([tmp_path])
    assert "\n" not in str(e.value)


def test_truncated_json_log_is_read_as_far_as_it_goes(tmp_path: Path) -> None:
    src = (BUNDLES / "smg-1.13.0-restart-between-probes").glob("*")
    for f in src:
        shutil.copy(f, tmp_path / f.name)
    log = tmp_path / "gateway.log"
    text = log.read_text()
    log.write_text(text[: int(len(text) * 0.8)])  # cut mid-line
    b = read_bundle([tmp_path])
    whole = read_bundle([BUNDLES / "smg-1.13.0-restart-between-probes"])
    assert 0 < len(b.of("request")) < len(whole.of("request"))
    assert any("gateway.log" in s for s in b.notes.skipped)


def test_one_file_for_every_process(tmp_path: Path) -> None:
    """A log interleaved from the gateway and the engines (one stream for all) gives both kinds of facts."""
    folder = BUNDLES / "smg-1.10.1-mooncake-restart"
    lines = gzip.decompress((folder / "gateway.log.gz").read_bytes()).decode().splitlines()
    engine = (folder / "prefill-0.log").read_text().splitlines()
    mixed = lines[:300] + engine + lines[300:] + (folder / "decode-0.log").read_text().splitlines()
    (tmp_path / "all.log").write_text("\n".join(mixed) + "\n")
    shutil.copy(folder / "gateway.cmdline", tmp_path)
    p = infer(read_bundle([tmp_path]))
    assert [(f.action, f.target, f.cite) for f in p.faults] == [("Restart", "prefill-0", "all.log:302")]
    assert [s.checker for s in p.symptoms] == ["recovery"]


def test_a_bundle_with_no_fault_says_what_to_add(tmp_path: Path) -> None:
    folder = BUNDLES / "smg-1.13.0-restart-between-probes"
    shutil.copy(folder / "gateway.log", tmp_path)
    with pytest.raises(IncidentError, match=r"no fault .*\[\[event\]\]"):
        infer(read_bundle([tmp_path]))


def test_no_workers_named(tmp_path: Path) -> None:
    (tmp_path / "incident.toml").write_text('[symptom]\nclients_saw = ["hang"]\n')
    with pytest.raises(IncidentError, match="names no prefill and decode workers"):
        infer(read_bundle([tmp_path]))
