"""OpenAI-style JSON errors: `{"error": {"message", "type", "code"}}` (CONTRACTS §2)."""

from __future__ import annotations

from aiohttp import web

from .core import Delivery, ErrorAnswer, LegError


class RouterError(Exception):
    """An error that maps to one client-facing HTTP answer."""

    def __init__(self, status: int, code: str, message: str, type_: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.type = type_

    @classmethod
    def from_answer(cls, answer: ErrorAnswer) -> RouterError:
        return cls(answer.status, answer.code, answer.message, answer.type)

    def body(self) -> dict[str, dict[str, str]]:
        return ErrorAnswer(self.status, self.code, self.message, self.type).body()

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status)


class UpstreamError(Exception):
    """A leg failed: the worker answered an error, refused, or overran its deadline."""

    def __init__(
        self, message: str, status: int = 502, code: str = "upstream_error", body: object = None,
        delivery: Delivery = Delivery.MAYBE_SENT, worker_status: int | None = None,
        worker_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.body = body
        # Only a failure that proves the worker never saw the request may be retried elsewhere (core.retry);
        # when in doubt it counts as sent.
        self.delivery = delivery
        # What the worker itself answered (its HTTP status, or the gRPC code's equivalent) and its error
        # message: the circuit breaker tells a worker's own failure from a client error or a failed KV load.
        self.worker_status = worker_status
        self.worker_message = worker_message if worker_message is not None else _error_message(body)

    def leg_error(self) -> LegError:
        """This failure as the core's dispatch flow takes it."""
        return LegError(self.status, self.code, str(self), self.delivery,
                        worker_status=self.worker_status, worker_message=self.worker_message)

    def to_router_error(self, leg: str) -> RouterError:
        return RouterError.from_answer(self.leg_error().answer(leg))


def _error_message(body: object) -> str | None:
    """The message of an OpenAI-style error body `{"error": {"message": ...}}` (or `{"error": "..."}`)."""
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict):
        err = err.get("message")
    return err if isinstance(err, str) else None
