"""The generated reference pages are what the code makes now (`python -m harness.docs_reference`)."""

from __future__ import annotations

from pathlib import Path

from harness.docs_reference import PAGES, main, stale_pages


def test_the_reference_pages_are_not_stale() -> None:
    assert stale_pages() == [], "run: python -m harness.docs_reference"


def test_a_changed_page_is_named_stale_and_written_again(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(PAGES)
    page = tmp_path / "checkers.md"
    page.write_text(page.read_text() + "edited by hand\n")
    assert stale_pages(tmp_path) == [str(page)]
    assert main(["--out", str(tmp_path), "--check"]) == 1
    text = (tmp_path / "cli.md").read_text()
    assert "## `pdchaos run`" in text and "## `pdchaos-router`" in text and "--inject-bug" in text


def test_every_report_json_field_has_its_meaning_and_no_meaning_outlives_its_field() -> None:
    from reports.schema_doc import sample_document, undocumented

    doc = sample_document()
    assert undocumented(doc) == []
    doc["results"][0]["new_field"] = 1
    del doc["findings"][0]["replay"]
    assert undocumented(doc) == ["results.new_field", "gone: findings.replay"]
