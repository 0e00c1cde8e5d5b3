"""The operator beside an HTTP gateway: a worker is registered again only when its engine's id changed, a
failed re-registration is retried on the next pass, and a worker removed on purpose is never added back."""

from __future__ import annotations

import asyncio

import pytest

from harness.routers.gateways.engine_id_operator import EngineIdOperator, Reregistration


class Engines:
    def __init__(self) -> None:
        self.ids: dict[str, str | None] = {"prefill-0": "a", "prefill-1": "b"}
        self.accept = True
        self.calls: list[str] = []

    async def read(self, engine: str) -> str | None:
        return self.ids[engine]

    async def reregister(self, engine: str) -> tuple[bool, str]:
        self.calls.append(engine)
        return self.accept, "POST: HTTP 202" if self.accept else "POST: HTTP 409"


def _operator(e: Engines) -> EngineIdOperator:
    op = EngineIdOperator(e.read, e.reregister, interval_s=0.01)
    op.watch("prefill-0", "a")
    op.watch("prefill-1", "b")
    return op


async def test_only_a_changed_id_is_registered_again() -> None:
    e = Engines()
    op = _operator(e)
    assert await op.step() == [] and e.calls == []
    e.ids["prefill-1"] = "b2"
    assert await op.step() == [Reregistration("prefill-1", "b", "b2", True, "POST: HTTP 202")]
    assert op.watched == {"prefill-0": "a", "prefill-1": "b2"}
    assert await op.step() == [] and e.calls == ["prefill-1"]


async def test_an_unreadable_engine_is_left_alone_and_a_refused_registration_is_tried_again() -> None:
    e = Engines()
    op = _operator(e)
    e.ids["prefill-0"] = None  # down or loading: nothing to tell the gateway yet
    assert await op.step() == []
    e.ids["prefill-0"], e.accept = "a2", False
    assert [r.ok for r in await op.step()] == [False]
    assert op.watched["prefill-0"] == "a"  # still the old id: the next pass tries again
    e.accept = True
    assert [(r.new_id, r.ok) for r in await op.step()] == [("a2", True)]
    assert e.calls == ["prefill-0", "prefill-0"]


async def test_a_worker_removed_on_purpose_is_never_added_back() -> None:
    e = Engines()
    op = _operator(e)
    op.forget("prefill-1")
    e.ids["prefill-1"] = "b2"
    assert await op.step() == [] and e.calls == []
    # A worker with no id known at registration is registered again once it has one.
    op.watch("prefill-1", None)
    assert [(r.old_id, r.new_id) for r in await op.step()] == [(None, "b2")]


async def test_run_reports_each_reregistration_until_cancelled() -> None:
    e = Engines()
    op = _operator(e)
    seen: list[Reregistration] = []
    saw: list[tuple[str, str | None, str]] = []
    task = asyncio.create_task(op.run(seen.append, lambda *change: saw.append(change)))
    e.ids["prefill-0"] = "a2"
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert saw == [("prefill-0", "a", "a2")]  # told before the re-registration, which can take seconds
    assert [r.fields() for r in seen] == [{"engine": "prefill-0", "old_engine_id": "a", "new_engine_id": "a2",
                                            "ok": True, "detail": "POST: HTTP 202"}]


def test_the_interval_must_be_positive() -> None:
    e = Engines()
    with pytest.raises(ValueError, match="interval"):
        EngineIdOperator(e.read, e.reregister, interval_s=0)


def test_each_cell_of_a_suite_gets_its_own_adapter() -> None:
    """Real-time cells overlap on one event loop: an adapter shared by two of them would register (and have
    its operator watch) the other cell's workers."""
    from harness.parallel import own_adapter
    from harness.routers.gateways.adapters import SmgOperatorRouter
    from harness.scenario import RouterSettings
    from harness.topology import allocate

    shared = SmgOperatorRouter("smg", version="1.13.0", flags=frozenset({"--prometheus-host"}))
    a, b = own_adapter(shared), own_adapter(shared)
    assert a is not shared and b is not a and own_adapter("smg==1.13.0") == "smg==1.13.0"
    for adapter in (a, b):
        adapter.launch(allocate("1p1d", "mooncake", "http"), RouterSettings(), ["prefill-0"], "/dev/null")
    a.registered_ids["prefill-0"] = "eng-a"
    assert b.registered_ids == {} and a.registrations is not b.registrations
