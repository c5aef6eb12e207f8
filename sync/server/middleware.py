"""The server's ASGI middleware: a cap on request bodies (413 from Content-Length or
while streaming) and one log line per request, never a body or a header."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("sync.server.app")  # the server's one logger, as sync.server.app names it


async def _send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Refuses bodies over `max_bytes` with 413: at once from the Content-Length header,
    or by counting a streamed body. Buffers the body for the app (which would buffer it
    anyway) so the count is exact whatever the framing."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await _send_json(send, 400, {"error": "invalid Content-Length header"})
                return
            if size > limit:
                await _send_json(send, 413, {"error": _too_large(f"{size} bytes", limit)})
                return
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                # Read (and drop) a bounded amount more, so a client still sending can
                # finish and read the answer instead of seeing a reset connection.
                dropped = 0
                while message.get("more_body", False) and dropped <= limit:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    dropped += len(message.get("body", b""))
                await _send_json(send, 413, {"error": _too_large("more", limit)})
                return
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _too_large(what: str, limit: int) -> str:
    return (
        f"request body too large: {what} exceed the limit of {limit} bytes;"
        " send smaller batches"
    )


class RequestLog:
    """One log line per request: method, path, status, time, sizes. Never bodies or
    headers (the Authorization header carries the token)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0
        sent = 0

        async def send_counting(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_counting)
        except BaseException:
            status = status or 500  # what the outermost error handler answers
            raise
        finally:
            declared = dict(scope["headers"]).get(b"content-length", b"0").decode("latin-1")
            log.info(
                "%s %s %d %.1fms in=%s out=%d",
                scope["method"],
                scope["path"],
                status,
                (time.perf_counter() - started) * 1000,
                declared,
                sent,
            )
