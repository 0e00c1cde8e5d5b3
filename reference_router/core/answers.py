"""How a leg failed (as the shell saw it) and the error answer a client gets, as plain values."""

from __future__ import annotations

from dataclasses import dataclass

from .retry import Delivery


@dataclass(frozen=True)
class ErrorAnswer:
    """The JSON error `{"error": {"message", "type", "code"}}` a client gets with HTTP `status`."""

    status: int
    code: str
    message: str
    type: str | None = None  # None: the default for the status (`body`)

    def body(self) -> dict[str, dict[str, str]]:
        """The JSON body the client gets: a 4xx is the client's (`invalid_request_error`), the rest the
        server's (`server_error`) unless a type is named."""
        kind = self.type or ("invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "code": self.code}}


@dataclass(frozen=True)
class LegError:
    """A failed leg: the status and code the client would get for it, how far the request got (only a leg
    that never reached its worker may run again elsewhere) and, when known, the worker's own status and
    error message (None: it gave no answer, or the driver could not tell)."""

    status: int
    code: str
    message: str
    delivery: Delivery = Delivery.MAYBE_SENT
    # What the worker itself answered, when it answered (a relayed 5xx is 502 in `status`): the circuit
    # breaker tells the worker's own failures from a client's error or a KV load its prefill broke.
    worker_status: int | None = None
    worker_message: str | None = None

    def answer(self, leg: str) -> ErrorAnswer:
        return ErrorAnswer(self.status, self.code, f"{leg} leg failed: {self.message}")
