"""Toxic descriptions: parsing and validating API bodies into immutable specs (sans-IO).

A spec is what the API shows and what each live connection turns into a stage (see stages.py).
Every accepted create or update gets a fresh `version`, so connections know to rebuild that stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from harness.toxiproxy.errors import INVALID_STREAM, INVALID_TOXIC_TYPE, ApiError, bad_body

UPSTREAM = "upstream"
DOWNSTREAM = "downstream"
STREAMS = (UPSTREAM, DOWNSTREAM)

# Attribute names per toxic type with their defaults; all integers, as in Toxiproxy.
# Units: latency/jitter/delay/timeout in ms, except slicer.delay in microseconds;
# bandwidth.rate in KB/s (1 KB = 1000 bytes); limit_data.bytes in bytes.
TOXIC_ATTRIBUTES: dict[str, dict[str, int]] = {
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 0},
    "slow_close": {"delay": 0},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 0},
    "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},
    "limit_data": {"bytes": 0},
}


@dataclass(frozen=True)
class ToxicSpec:
    name: str
    type: str
    stream: str
    toxicity: float
    attributes: Mapping[str, int] = field(default_factory=dict)
    version: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }


def _as_int(name: str, value: object) -> int:
    # JSON numbers arrive as int or float; bool is an int subclass but never a valid amount.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_body(f"attribute {name} must be a number")
    if isinstance(value, float) and not value.is_integer():
        raise bad_body(f"attribute {name} must be an integer")
    if value < 0:
        raise bad_body(f"attribute {name} must not be negative")
    return int(value)


def _toxicity(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_body("toxicity must be a number")
    if not 0.0 <= float(value) <= 1.0:
        raise bad_body("toxicity must be between 0 and 1")
    return float(value)


def _merge_attributes(toxic_type: str, base: Mapping[str, int], given: object) -> dict[str, int]:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise bad_body("attributes must be an object")
    merged = dict(base)
    known = TOXIC_ATTRIBUTES[toxic_type]
    for key, value in given.items():
        if key in known:  # unknown attributes are ignored, as Toxiproxy's JSON decoding does
            merged[key] = _as_int(key, value)
    _check_consistency(toxic_type, merged)
    return merged


def _check_consistency(toxic_type: str, attrs: Mapping[str, int]) -> None:
    if toxic_type == "slicer":
        # Toxiproxy panics or recurses forever on these; refuse them up front.
        if attrs["average_size"] < 1:
            raise bad_body("slicer average_size must be at least 1")
        if attrs["size_variation"] >= attrs["average_size"]:
            raise bad_body("slicer size_variation must be less than average_size")


def check_name(name: str, what: str) -> None:
    """A proxy or toxic name is one path segment of the API (`/proxies/{name}`, `.../toxics/{name}`): with
    a '/' (or unprintable) it would be created but no URL could reach it, so it is refused."""
    if "/" in name or name.strip() != name or not name.isprintable():
        raise bad_body(f"{what} name {name!r} must be printable, without '/' or surrounding spaces")


def parse_stream(value: object) -> str:
    if not isinstance(value, str) or value.lower() not in STREAMS:
        raise ApiError(400, INVALID_STREAM)
    return value.lower()


def parse_new_toxic(body: object, version: int) -> ToxicSpec:
    """A toxic from a `POST /proxies/{p}/toxics` body; raises ApiError(400) on bad input."""
    if not isinstance(body, dict):
        raise bad_body("expected a JSON object")
    stream = parse_stream(body.get("stream") or DOWNSTREAM)
    toxic_type = body.get("type")
    if not isinstance(toxic_type, str) or toxic_type not in TOXIC_ATTRIBUTES:
        raise ApiError(400, INVALID_TOXIC_TYPE)
    name = body.get("name") or f"{toxic_type}_{stream}"
    if not isinstance(name, str):
        raise bad_body("name must be a string")
    check_name(name, "toxic")
    toxicity = _toxicity(body["toxicity"]) if body.get("toxicity") is not None else 1.0
    attrs = _merge_attributes(toxic_type, TOXIC_ATTRIBUTES[toxic_type], body.get("attributes"))
    return ToxicSpec(name, toxic_type, stream, toxicity, attrs, version)


def update_toxic(spec: ToxicSpec, body: object, version: int) -> ToxicSpec:
    """The toxic after an update body: given attributes and toxicity replace old ones, the rest stays."""
    if not isinstance(body, dict):
        raise bad_body("expected a JSON object")
    toxicity = _toxicity(body["toxicity"]) if body.get("toxicity") is not None else spec.toxicity
    attrs = _merge_attributes(spec.type, spec.attributes, body.get("attributes"))
    return ToxicSpec(spec.name, spec.type, spec.stream, toxicity, attrs, version)
