"""Worker model: spec validation, defaults, property updates (bug #7), the API record (bug #14), registry."""

from __future__ import annotations

import dataclasses

import pytest

from reference_router.core import (
    MOONCAKE_DEFAULT_BOOTSTRAP_PORT,
    Connector,
    DuplicateWorkerError,
    HealthConfig,
    MetadataRead,
    ReadOutcome,
    Role,
    Status,
    Transport,
    Worker,
    WorkerRegistry,
    apply_metadata_read,
    apply_property_update,
    make_worker_spec,
    parse_connector,
    spec_from_json,
    worker_api_dict,
)

CFG = HealthConfig()


@pytest.mark.parametrize(
    ("url", "role", "transport", "connector", "bootstrap"),
    [
        (
            "http://127.0.0.1:8000",
            "prefill",
            Transport.HTTP,
            Connector.MOONCAKE,
            MOONCAKE_DEFAULT_BOOTSTRAP_PORT,
        ),
        ("http://127.0.0.1:8000", "decode", Transport.HTTP, Connector.MOONCAKE, None),
        ("grpc://127.0.0.1:50051", "prefill", Transport.GRPC, None, None),
        ("grpc://127.0.0.1:50051", "decode", Transport.GRPC, None, None),
        ("http://127.0.0.1:8000", "regular", Transport.HTTP, Connector.NONE, None),
        ("grpc://127.0.0.1:50051", "regular", Transport.GRPC, Connector.NONE, None),
        ("HTTP://127.0.0.1:8000/", "PREFILL", Transport.HTTP, Connector.MOONCAKE, 8998),
    ],
)
def test_defaults_by_transport_and_role(
    url: str, role: str, transport: Transport, connector: Connector | None, bootstrap: int | None
) -> None:
    spec = make_worker_spec(url, role)
    assert spec.transport is transport
    assert spec.connector is connector
    assert spec.bootstrap_port == bootstrap
    assert spec.url == url.lower().rstrip("/")
    assert spec.host == "127.0.0.1"
    assert spec.dp_size == 1 and spec.priority == 0 and dict(spec.labels) == {}


def test_explicit_fields_are_kept() -> None:
    spec = make_worker_spec(
        "grpc://127.0.0.1:6000",
        Role.PREFILL,
        connector="nixl",
        bootstrap_port=9100,
        dp_size=2,
        labels={"zone": "a"},
        priority=5,
        engine_id="seed-1",
        kv_role="kv_producer",
    )
    assert (spec.connector, spec.bootstrap_port, spec.dp_size) == (Connector.NIXL, 9100, 2)
    assert (dict(spec.labels), spec.priority, spec.engine_id, spec.kv_role) == (
        {"zone": "a"},
        5,
        "seed-1",
        "kv_producer",
    )
    assert spec.port == 6000 and spec.is_pd


def test_http_without_port_defaults_to_80() -> None:
    assert make_worker_spec("http://localhost", "regular").port == 80


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"url": "ftp://127.0.0.1:1"}, "scheme"),
        ({"url": "https://127.0.0.1:1"}, "scheme"),
        ({"url": "127.0.0.1:8000"}, "scheme"),
        ({"url": ""}, "url"),
        ({"url": "http://:8000"}, "host"),
        ({"url": "http://127.0.0.1:99999"}, "port"),
        ({"url": "http://127.0.0.1:abc"}, "port"),
        ({"url": "grpc://127.0.0.1"}, "port"),
        ({"url": "http://127.0.0.1:8000/v1"}, "path"),
        ({"role": "both"}, "role"),
        ({"role": 3}, "role"),
        ({"connector": "lmcache"}, "connector"),
        ({"bootstrap_port": 0}, "bootstrap_port"),
        ({"bootstrap_port": 70000}, "bootstrap_port"),
        ({"bootstrap_port": "8998"}, "bootstrap_port"),
        ({"bootstrap_port": True}, "bootstrap_port"),
        ({"dp_size": 0}, "dp_size"),
        ({"dp_size": 1.5}, "dp_size"),
        ({"priority": "high"}, "priority"),
        ({"labels": ["a"]}, "labels"),
        ({"labels": {"a": 1}}, "labels"),
        ({"engine_id": ""}, "engine_id"),
        ({"kv_role": 5}, "kv_role"),
    ],
)
def test_invalid_spec_is_a_clear_value_error(kwargs: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"url": "http://127.0.0.1:8000", "role": "prefill"}
    args.update(kwargs)
    url, role = args.pop("url"), args.pop("role")
    with pytest.raises(ValueError, match=needle):
        make_worker_spec(url, role, **args)  # type: ignore[arg-type]


def test_error_messages_list_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="prefill, decode, regular"):
        make_worker_spec("http://127.0.0.1:1", "both")
    with pytest.raises(ValueError, match="mooncake, nixl, none"):
        make_worker_spec("http://127.0.0.1:1", "prefill", connector="p2p")


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("MooncakeConnector", Connector.MOONCAKE),
        ("NixlConnector", Connector.NIXL),
        ("", Connector.NONE),
        ("mooncake", Connector.MOONCAKE),
        (" NIXL ", Connector.NIXL),
        (Connector.NONE, Connector.NONE),
    ],
)
def test_parse_connector_accepts_vllm_names(name: str, want: Connector) -> None:
    assert parse_connector(name) is want


def test_spec_from_json() -> None:
    spec = spec_from_json(
        {
            "url": "http://127.0.0.1:8100",
            "role": "prefill",
            "bootstrap_port": 9001,
            "labels": {"k": "v"},
            "priority": 2,
        }
    )
    assert (spec.role, spec.bootstrap_port, spec.priority) == (Role.PREFILL, 9001, 2)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ([], "object"),
        ({"url": "http://127.0.0.1:1"}, "required"),
        ({"role": "decode"}, "required"),
        ({"url": "http://127.0.0.1:1", "role": "decode", "colour": "red"}, "unknown field"),
    ],
)
def test_spec_from_json_rejects_bad_bodies(body: object, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        spec_from_json(body)


def learned_worker() -> Worker:
    """A gRPC Mooncake prefill whose connector and engine id were learned at runtime."""
    w = Worker.new("w1", make_worker_spec("grpc://127.0.0.1:7000", "prefill", labels={"a": "1"}))
    read = MetadataRead(ReadOutcome.COMPLETE, engine_id="eng-B", connector="MooncakeConnector", dp_size=2)
    apply_metadata_read(w, read, now=1.0, cfg=CFG)
    return w


def test_property_update_keeps_connector_role_engine_id_and_bootstrap_port() -> None:
    """Bug #7: a labels/priority update must not drop the KV transfer config."""
    spec = make_worker_spec(
        "http://127.0.0.1:8100",
        "prefill",
        connector="mooncake",
        bootstrap_port=9001,
        engine_id="seed",
        dp_size=2,
        labels={"a": "1"},
    )
    new = apply_property_update(spec, {"labels": {"b": "2"}, "priority": 7})
    assert dict(new.labels) == {"b": "2"} and new.priority == 7
    for f in dataclasses.fields(spec):
        if f.name not in ("labels", "priority"):
            assert getattr(new, f.name) == getattr(spec, f.name), f.name
    assert apply_property_update(spec, {}) == spec


def test_registry_update_keeps_runtime_and_learned_state() -> None:
    reg = WorkerRegistry()
    w = reg.add(make_worker_spec("grpc://127.0.0.1:7000", "prefill"))
    apply_metadata_read(
        w,
        MetadataRead(ReadOutcome.COMPLETE, engine_id="eng-B", connector="MooncakeConnector"),
        now=1.0,
        cfg=CFG,
    )
    w.runtime.status = Status.READY
    before = worker_api_dict(w)
    reg.update(w.id, {"priority": 3})
    after = worker_api_dict(w)
    assert after["priority"] == 3
    assert {k: v for k, v in after.items() if k != "priority"} == {
        k: v for k, v in before.items() if k != "priority"
    }
    assert after["connector"] == "mooncake" and after["bootstrap_port"] == 8998
    assert after["kv_engine_id"] == "eng-B" and after["status"] == "ready"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"connector": "none"}, "only"),
        ({"bootstrap_port": 1}, "only"),
        ({"url": "http://x:1"}, "only"),
        ({"priority": "x"}, "priority"),
        ({"priority": True}, "priority"),
        ({"labels": 3}, "labels"),
        ("x", "object"),
    ],
)
def test_property_update_rejects_other_fields(body: object, needle: str) -> None:
    spec = make_worker_spec("http://127.0.0.1:8100", "prefill")
    with pytest.raises(ValueError, match=needle):
        apply_property_update(spec, body)


def test_api_dict_shows_engine_id_in_force_not_registration_id() -> None:
    """Bug #14."""
    w = Worker.new("w9", make_worker_spec("http://127.0.0.1:8100", "prefill", engine_id="at-registration"))
    assert worker_api_dict(w)["kv_engine_id"] == "at-registration"
    apply_metadata_read(w, MetadataRead(ReadOutcome.COMPLETE, engine_id="after-restart"), now=5.0, cfg=CFG)
    d = worker_api_dict(w)
    assert d["kv_engine_id"] == "after-restart" and d["engine_id_confirmed"] is True
    assert w.spec.engine_id == "at-registration"


def test_api_dict_shape() -> None:
    w = learned_worker()
    d = worker_api_dict(w)
    assert set(d) == {
        "id",
        "url",
        "role",
        "transport",
        "connector",
        "bootstrap_port",
        "status",
        "kv_engine_id",
        "engine_id_confirmed",
        "labels",
        "priority",
        "dp_size",
        "breaker",
    }
    assert d == {
        "id": "w1",
        "url": "grpc://127.0.0.1:7000",
        "role": "prefill",
        "transport": "grpc",
        "connector": "mooncake",
        "bootstrap_port": 8998,
        "status": "pending",
        "kv_engine_id": "eng-B",
        "engine_id_confirmed": True,
        "labels": {"a": "1"},
        "priority": 0,
        "dp_size": 2,
        "breaker": "closed",
    }


def test_api_dict_unknown_connector_is_null() -> None:
    w = Worker.new("w2", make_worker_spec("grpc://127.0.0.1:7001", "decode"))
    d = worker_api_dict(w)
    assert d["connector"] is None and d["bootstrap_port"] is None and d["kv_engine_id"] is None


def test_registry_ids_roles_duplicates_and_removal() -> None:
    reg = WorkerRegistry()
    p = reg.add(make_worker_spec("http://127.0.0.1:8100", "prefill"))
    d = reg.add(make_worker_spec("http://127.0.0.1:8200", "decode"))
    same_url_other_role = reg.add(make_worker_spec("http://127.0.0.1:8100", "decode"))
    assert [p.id, d.id, same_url_other_role.id] == ["w1", "w2", "w3"]
    with pytest.raises(DuplicateWorkerError, match="w1"):
        reg.add(make_worker_spec("http://127.0.0.1:8100", "prefill"))
    # Another spelling of one engine is the same worker (the sim world and the server both add through here).
    for spelling in ("http://localhost:8100", "HTTP://127.0.0.1:8100/", "http://LOCALHOST:8100/"):
        with pytest.raises(DuplicateWorkerError, match=r"has url http://127\.0\.0\.1:8100 as prefill"):
            reg.add(make_worker_spec(spelling, "prefill"))
    assert len(reg) == 3
    assert isinstance(DuplicateWorkerError("x"), ValueError)
    assert reg.by_role(Role.DECODE) == [d, same_url_other_role]
    assert reg.ready(Role.DECODE) == []
    d.runtime.status = Status.READY
    assert reg.ready(Role.DECODE) == [d]
    assert reg.remove("w2") is d and reg.get("w2") is None and reg.remove("w2") is None
    assert len(reg) == 2 and [w.id for w in reg] == ["w1", "w3"]
    assert reg.add(make_worker_spec("http://127.0.0.1:8300", "decode")).id == "w4"  # ids never reused
    with pytest.raises(KeyError):
        reg.update("nope", {"priority": 1})
