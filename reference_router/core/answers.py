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
    type: str | None = None  # None: the shell's default for the status


@dataclass(frozen=True)
class LegError:
    """A failed leg: the status and code the client would get for it, and how far the request got (only a
    leg that never reached its worker may run again elsewhere)."""

    status: int
    code: str
    message: str
    delivery: Delivery = Delivery.MAYBE_SENT

    def answer(self, leg: str) -> ErrorAnswer:
        return ErrorAnswer(self.status, self.code, f"{leg} leg failed: {self.message}")
