"""The API's error type: Toxiproxy answers every failure as {"error": message, "status": code}."""

from __future__ import annotations


class ApiError(Exception):
    """A control-API failure with the HTTP status Toxiproxy would answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def body(self) -> dict[str, object]:
        return {"error": self.message, "status": self.status}


def bad_body(detail: str) -> ApiError:
    return ApiError(400, f"bad request body: {detail}")


def missing_field(field: str) -> ApiError:
    return ApiError(400, f"missing required field: {field}")


PROXY_NOT_FOUND = "proxy not found"
PROXY_EXISTS = "proxy already exists"
TOXIC_NOT_FOUND = "toxic not found"
TOXIC_EXISTS = "toxic already exists"
INVALID_STREAM = "stream was invalid, can be either upstream or downstream"
INVALID_TOXIC_TYPE = "invalid toxic type"
