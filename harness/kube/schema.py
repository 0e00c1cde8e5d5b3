"""Manifests checked against the Kubernetes API schema as the client library ships it (its generated
model classes: every field, its type, which ones are required), with no cluster.

Two checks, because the models alone are lenient in one place each: a walk over the document that names
every key the schema does not have (the models' `from_dict` drops unknown keys silently), and building
the model from the document, which rejects wrong types (the models are strict: `"80"` is not a port) and
missing required fields. Needs the `kubernetes` package (`pip install -e '.[k8s]'`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MODELS = {
    ("v1", "Pod"): "V1Pod",
    ("v1", "Service"): "V1Service",
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
    ("apps/v1", "Deployment"): "V1Deployment",
}
_LIST = re.compile(r"^(?:List|list)\[(.+)\]$")
_DICT = re.compile(r"^(?:Dict\[str, (.+)\]|dict\(str, (.+)\))$")


class SchemaUnavailable(RuntimeError):
    """The kubernetes client is not installed."""


def kube_client() -> Any:
    try:
        import kubernetes.client as client
    except ImportError as e:
        raise SchemaUnavailable("the kubernetes client is not installed: pip install -e '.[k8s]'") from e
    return client


def client_version() -> str:
    try:
        import kubernetes
    except ImportError:
        return ""
    return str(getattr(kubernetes, "__version__", ""))


def schema_problems(doc: Mapping[str, Any]) -> list[str]:
    """Every way `doc` departs from the API schema (empty: valid). SchemaUnavailable without the client."""
    client = kube_client()
    api, kind = doc.get("apiVersion"), doc.get("kind")
    name = MODELS.get((str(api), str(kind)))
    if name is None:
        return [f"no model for apiVersion {api!r} kind {kind!r} (known: {sorted(MODELS)})"]
    model = getattr(client, name)
    where = f"{kind} {(doc.get('metadata') or {}).get('name', '?')}"
    problems = [f"{where}: {p}" for p in _unknown_keys(client, model, doc, "")]
    try:
        _build(client, model, name, doc)
    except Exception as e:  # pydantic's ValidationError; ValueError/TypeError from older clients
        problems.append(f"{where}: {type(e).__name__}: {' '.join(str(e).split())[:400]}")
    return problems


def _build(client: Any, model: Any, name: str, doc: Mapping[str, Any]) -> Any:
    if hasattr(model, "from_dict"):
        return model.from_dict(dict(doc))
    # Older clients (generated without pydantic): their deserializer builds the model and its constructor
    # checks required fields and enum values.
    return client.ApiClient()._ApiClient__deserialize(dict(doc), name)


def _unknown_keys(client: Any, model: Any, value: Any, path: str) -> list[str]:
    if not isinstance(value, Mapping):
        return []
    by_key = {json_key: attr for attr, json_key in model.attribute_map.items()}
    out = []
    for key, item in value.items():
        attr = by_key.get(key)
        if attr is None:
            out.append(f"{path}{key}: no such field in {model.__name__}")
            continue
        out += _check_type(client, model.openapi_types[attr], item, f"{path}{key}.")
    return out


def _check_type(client: Any, type_name: str, value: Any, path: str) -> list[str]:
    lst = _LIST.match(type_name)
    if lst and isinstance(value, list):
        inner = lst.group(1)
        return [p for i, v in enumerate(value) for p in _check_type(client, inner, v, f"{path[:-1]}[{i}].")]
    dct = _DICT.match(type_name)
    if dct and isinstance(value, Mapping):
        inner = dct.group(1) or dct.group(2)
        return [p for k, v in value.items() for p in _check_type(client, inner, v, f"{path}{k}.")]
    sub = getattr(client, type_name, None)
    if sub is not None and hasattr(sub, "attribute_map"):
        return _unknown_keys(client, sub, value, path)
    return []
