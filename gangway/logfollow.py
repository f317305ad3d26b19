"""What `follow_logs` keeps between connections to a log stream, for both clients.

A log stream (Server-Sent Events, decoded by httpx-sse) can drop: a proxy times it out,
the service restarts, the network blips. Each `line` event carries its cursor as the SSE
`id`, so the client reconnects with `Last-Event-ID` and reads on with no gap and no
repeat; it gives up after `max_reconnects` drops in a row without a new line.
"""

from __future__ import annotations

from httpx_sse import ServerSentEvent

from gangway.errors import TransportError
from gangway.models import LogLine

END = object()  # the job ended and every line was sent


class LogCursor:
    def __init__(self, *, max_reconnects: int, backoff_s: float) -> None:
        self.last_event_id: str | None = None
        self._max_reconnects, self._backoff_s = max_reconnects, backoff_s
        self._drops = 0

    def headers(self) -> dict[str, str]:
        """A first connection starts with the tail; a later one resumes after the last line."""
        return {} if self.last_event_id is None else {"Last-Event-ID": self.last_event_id}

    def take(self, event: ServerSentEvent) -> LogLine | object | None:
        """A `LogLine`, `END`, or None for anything else (pings are comments already)."""
        if event.event == "end":
            return END
        if event.event != "line":
            return None
        self.last_event_id, self._drops = event.id, 0
        return LogLine.model_validate_json(event.data)

    def dropped(self, where: str, cause: Exception | None) -> float:
        """Count a dropped stream: the seconds to wait before reconnecting, or raise
        `TransportError` once it dropped too often without progress."""
        self._drops += 1
        if self._drops > self._max_reconnects:
            reason = cause or "the stream closed before the job ended"
            raise TransportError(
                f"lost the log stream from {where} {self._drops} times in a row: {reason}"
            ) from cause
        return self._backoff_s * self._drops
