"""A client's stop strings applied to a stream of text the router builds from token ids (gRPC). No I/O.

vLLM's gRPC engine ends its output with the token that completes a stop string and returns token ids: the
text the client gets is the router's to cut, where the first stop string begins (the stop string itself is
not part of it), as vLLM's HTTP server does. Streamed, a piece that may be the start of a stop string is held
back until the next piece says whether it is one.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdchaos.stop_strings import cut_at_stop


class StopCutter:
    """Cuts a stream of text deltas at the first stop string: `push` each delta, send what it returns, and
    `flush` at the end."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stops)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._text = ""  # everything pushed
        self._sent = 0  # how much of it went out
        self.stopped = False

    def push(self, delta: str) -> str:
        """What may go out now: nothing that could still turn out to start a stop string."""
        if self.stopped or not delta:
            return ""
        self._text += delta
        if not self._stops:
            return self._take(len(self._text))
        cut = cut_at_stop(self._text, self._stops)
        if len(cut) < len(self._text):
            self.stopped = True
            return self._take(len(cut))
        return self._take(max(self._sent, len(self._text) - self._hold))

    def flush(self) -> str:
        """The rest, at the end of the output (no stop string in it, or `push` would have cut it)."""
        return "" if self.stopped else self._take(len(self._text))

    def _take(self, upto: int) -> str:
        out = self._text[self._sent:upto]
        self._sent = max(self._sent, upto)
        return out
