"""The collector's ASGI guard: the token (header, cookie or ?token= once) and the body limit.

It wraps the whole app (API and dashboard), so no route can forget it.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
from http.cookies import SimpleCookie
from urllib.parse import parse_qs

from fastapi import Request

from forksight.monitor.errors import ApiError
from forksight.limits import MAX_BODY_BYTES

TOKEN_COOKIE = "forksight_token"


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class GuardMiddleware:
    """Pure ASGI: refuse bodies over MAX_BODY_BYTES (413) and, with a token, anything without it (401)."""

    def __init__(self, app, token: str | None, max_body: int = MAX_BODY_BYTES):
        self.app, self.token, self.max_body = app, token, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        set_cookie = False
        if self.token:
            supplied = None
            auth = headers.get("authorization", "")
            if auth.lower().startswith("bearer "):
                supplied = auth[7:].strip()
            elif "cookie" in headers:
                cookie = SimpleCookie()
                cookie.load(headers["cookie"])
                if TOKEN_COOKIE in cookie:
                    supplied = cookie[TOKEN_COOKIE].value
            if supplied is None:
                query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
                if "token" in query:
                    supplied, set_cookie = query["token"][0], True
            if supplied is None or not hmac.compare_digest(supplied.encode(), self.token.encode()):
                what = "missing" if supplied is None else "wrong"
                return await _send_json(send, 401, f"{what} token: send 'Authorization: Bearer <token>' "
                                        "(browsers: open the dashboard once with ?token=<token>)")
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return await _send_json(send, 413, f"body is {length} bytes; the limit is {self.max_body}: "
                                    "send smaller batches")
        if set_cookie:
            token = self.token

            async def send_with_cookie(message):
                if message["type"] == "http.response.start":
                    cookie = f"{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict".encode()
                    message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", cookie)]}
                await send(message)
            return await self.app(scope, receive, send_with_cookie)
        return await self.app(scope, receive, send)


async def _send_json(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, refusing (413) past `limit` even without a Content-Length."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body is over {limit} bytes; send smaller batches")
        chunks.append(chunk)
    return b"".join(chunks)


