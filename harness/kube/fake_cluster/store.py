"""The fake API server's objects: one in-memory table per resource, stamped and versioned as the real one.

Objects are plain JSON dicts, kept as the API returns them. A change made in place (the kubelet writing
a pod's status) is published with `touch`, which gives the object a new resourceVersion and tells the
listeners (the node-port forwarder re-evaluates its endpoints). All of it runs on the fake's event loop:
no locks.
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
import string
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    api_version: str
    namespaced: bool = True

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


RESOURCES: dict[str, Resource] = {
    r.plural: r
    for r in (
        Resource("namespaces", "Namespace", "v1", namespaced=False),
        Resource("pods", "Pod", "v1"),
        Resource("services", "Service", "v1"),
        Resource("secrets", "Secret", "v1"),
        Resource("networkpolicies", "NetworkPolicy", "networking.k8s.io/v1"),
    )
}


def rfc3339(when: dt.datetime | None = None) -> str:
    """The API's timestamp form (seconds, UTC, `Z`): what the client's datetime parser expects."""
    when = when or dt.datetime.now(dt.UTC)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """An answer that is a `Status` failure; the HTTP code is the Status's."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> Obj:
        out: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            out["details"] = self.details
        return out


def not_found(plural: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid(kind: str, name: str, message: str) -> ApiError:
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {message}', {"name": name, "kind": kind})


def success_status(plural: str, obj: Obj) -> Obj:
    meta = obj.get("metadata", {})
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": meta.get("name", ""), "kind": plural, "uid": meta.get("uid", "")}}


# ---------------------------------------------------------------- selectors

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_SET_RE = re.compile(rf"^({_KEY})\s+(in|notin)\s+\(([^()]*)\)$")
_EQ_RE = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*([-A-Za-z0-9_.]*)$")
_EXISTS_RE = re.compile(rf"^(!?)\s*({_KEY})$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "in":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values  # notin: a missing key matches, as on a real server


def _split_terms(text: str) -> list[str]:
    """Commas separate requirements, except inside the parentheses of a set (`a in (x,y),b`)."""
    terms, depth, cur = [], 0, []
    for ch in text:
        if ch == "," and depth == 0:
            terms.append("".join(cur))
            cur = []
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur.append(ch)
    terms.append("".join(cur))
    return [t.strip() for t in terms if t.strip()]


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Both forms of `labelSelector`: equality (`a=b,c!=d`) and set-based (`a in (x,y)`, `a`, `!a`)."""
    reqs: list[Requirement] = []
    for term in _split_terms(text or ""):
        if m := _SET_RE.match(term):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif m := _EQ_RE.match(term):
            reqs.append(Requirement(m.group(1), "notin" if m.group(2) == "!=" else "in",
                                    frozenset({m.group(3)})))
        elif m := _EXISTS_RE.match(term):
            reqs.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise bad_request(f"unable to parse requirement: {term!r}")
    return reqs


def labels_match(reqs: Iterable[Requirement], labels: dict[str, str] | None) -> bool:
    return all(r.matches(labels or {}) for r in reqs)


def parse_field_selector(text: str | None) -> list[tuple[str, bool, str]]:
    """`fieldSelector` terms as (dotted path, equal?, value): `metadata.name=x,status.phase!=Running`."""
    out = []
    for term in _split_terms(text or ""):
        m = re.match(r"^([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*)$", term)
        if not m:
            raise bad_request(f"invalid field selector: {term!r}")
        out.append((m.group(1), m.group(2) != "!=", m.group(3).strip()))
    return out


def _field(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def fields_match(terms: Iterable[tuple[str, bool, str]], obj: Obj) -> bool:
    return all((_field(obj, path) == value) == equal for path, equal, value in terms)


# ---------------------------------------------------------------- the store

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class Store:
    def __init__(self) -> None:
        self._tables: dict[str, dict[tuple[str, str], Obj]] = {p: {} for p in RESOURCES}
        self._version = 0
        # Called after every change with (plural, object); the object may just have been removed.
        self.listeners: list[Callable[[str, Obj], None]] = []

    @property
    def resource_version(self) -> str:
        return str(self._version)

    def _bump(self) -> str:
        self._version += 1
        return str(self._version)

    def _notify(self, plural: str, obj: Obj) -> None:
        for listener in list(self.listeners):
            listener(plural, obj)

    def find(self, plural: str, namespace: str, name: str) -> Obj | None:
        return self._tables[plural].get((namespace if RESOURCES[plural].namespaced else "", name))

    def get(self, plural: str, namespace: str, name: str) -> Obj:
        obj = self.find(plural, namespace, name)
        if obj is None:
            raise not_found(plural, name)
        return obj

    def list(self, plural: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[Obj]:
        reqs = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector)
        out = []
        for (ns, _), obj in sorted(self._tables[plural].items()):
            if namespace is not None and RESOURCES[plural].namespaced and ns != namespace:
                continue
            if labels_match(reqs, obj["metadata"].get("labels")) and fields_match(fields, obj):
                out.append(obj)
        return out

    def list_object(self, plural: str, items: list[Obj]) -> Obj:
        res = RESOURCES[plural]
        return {"kind": res.list_kind, "apiVersion": res.api_version,
                "metadata": {"resourceVersion": self.resource_version}, "items": items}

    def prepare(self, plural: str, namespace: str, body: Obj) -> Obj:
        """The object `body` would become (name checked, metadata stamped), without storing it."""
        res = RESOURCES[plural]
        if not isinstance(body, dict):
            raise bad_request(f"the body of a {res.kind} must be a JSON object")
        if body.get("kind") not in (None, res.kind):
            raise bad_request(f"the kind of the body ({body.get('kind')}) is not {res.kind}")
        obj = dict(body)
        meta = dict(obj.get("metadata") or {})
        if res.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise bad_request("the namespace of the provided object does not match the namespace "
                                  "sent on the request")
            meta["namespace"] = namespace
        name = meta.get("name")
        if not name and meta.get("generateName"):
            alphabet = string.ascii_lowercase + string.digits
            name = meta["generateName"] + "".join(secrets.choice(alphabet) for _ in range(5))
            meta["name"] = name
        if not name:
            raise invalid(res.kind, "", "metadata.name: Required value: name or generateName is required")
        if not isinstance(name, str) or len(name) > 253 or not _NAME_RE.match(name):
            raise invalid(res.kind, str(name), f'metadata.name: Invalid value: "{name}": a lowercase '
                          "RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
                          "'.', and must start and end with an alphanumeric character")
        for key in ("labels", "annotations"):
            if key in meta and not isinstance(meta[key], dict):
                raise bad_request(f"metadata.{key} must be a map of strings")
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=rfc3339(), generation=1)
        meta.pop("resourceVersion", None)
        meta.pop("deletionTimestamp", None)
        obj.update(kind=res.kind, apiVersion=res.api_version, metadata=meta)
        return obj

    def add(self, plural: str, obj: Obj) -> Obj:
        """Store a prepared object; 404 if its namespace does not exist, 409 if its name is taken."""
        res = RESOURCES[plural]
        meta = obj["metadata"]
        ns = meta.get("namespace", "") if res.namespaced else ""
        if res.namespaced and self.find("namespaces", "", ns) is None:
            raise not_found("namespaces", ns)
        if (ns, meta["name"]) in self._tables[plural]:
            raise ApiError(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists',
                           {"name": meta["name"], "kind": plural})
        meta["resourceVersion"] = self._bump()
        self._tables[plural][(ns, meta["name"])] = obj
        self._notify(plural, obj)
        return obj

    def touch(self, plural: str, obj: Obj) -> None:
        """Publish a change made in place; a no-op for an object no longer stored."""
        meta = obj["metadata"]
        key = (meta.get("namespace", "") if RESOURCES[plural].namespaced else "", meta["name"])
        if self._tables[plural].get(key) is not obj:
            return
        meta["resourceVersion"] = self._bump()
        self._notify(plural, obj)

    def remove(self, plural: str, obj: Obj) -> None:
        meta = obj["metadata"]
        key = (meta.get("namespace", "") if RESOURCES[plural].namespaced else "", meta["name"])
        if self._tables[plural].get(key) is obj:
            del self._tables[plural][key]
            self._bump()
            self._notify(plural, obj)
