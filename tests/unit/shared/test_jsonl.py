"""JSON lines: what orjson writes and what it refuses both come back whole; damaged lines cost themselves."""

from __future__ import annotations

import json
from pathlib import Path

from pdchaos.jsonl import JsonlWriter, dumps_line, loads_line, read_jsonl, read_jsonl_lines


def test_lines_are_compact_sorted_and_the_same_as_the_standard_library_for_plain_records() -> None:
    record = {"t": 1.5, "kind": "request_completed", "seq": 3, "nested": {"b": [1, 2.25, None], "a": True}}
    expected = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
    assert dumps_line(record) == expected
    assert loads_line(dumps_line(record)) == record


def test_records_orjson_refuses_are_written_by_the_standard_library_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    writer = JsonlWriter(path)
    huge = {"kind": "x", "big": 2**70}
    int_keys = {"kind": "y", "by_port": {8000: "prefill-0"}}
    surrogate = {"kind": "z", "text": "bad \ud800 text"}
    not_json = {"kind": "w", "path": Path("/tmp/x")}
    for rec in (huge, int_keys, surrogate, not_json):
        writer.write(rec)
    writer.close()
    back = list(read_jsonl(path))
    assert back == [huge, {"kind": "y", "by_port": {"8000": "prefill-0"}}, surrogate,
                    {"kind": "w", "path": "/tmp/x"}]


def test_a_torn_or_damaged_line_is_skipped_and_named(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_bytes(b'{"a":1}\n\xff\xfe garbage\n[1,2]\n\n{"b":2}\n{"c":')
    read = read_jsonl_lines(path)
    assert read.records == [{"a": 1}, {"b": 2}]
    assert read.bad_lines == [2, 3, 6]


def test_the_writer_appends_and_a_writer_without_a_path_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    for n in (1, 2):
        w = JsonlWriter(path, flush_each=False)
        w.write({"n": n})
        w.close()
    assert [r["n"] for r in read_jsonl(path)] == [1, 2]
    JsonlWriter(None).write({"n": 3})  # a no-op, not an error
