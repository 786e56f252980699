"""The collector's ASGI guard around everything it serves (API, docs, dashboard): the token, or
on the tokenless loopback default Host and Origin checks; writes' media type; the body limit."""
# Without a token, Host must name this machine and Origin (when sent) be this page, so other
# sites and DNS rebinding get nowhere; the body limit counts bytes as they stream in.
from __future__ import annotations

import hmac
import ipaddress
import json
import re
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from forksight.base.limits import MAX_BODY_BYTES
from forksight.base.constants import ARROW_MEDIA_TYPE

TOKEN_COOKIE = "forksight_token"
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
ARROW_ROUTE = re.compile(r"/api/runs/[^/]+/tokens/?")
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")     # what the tokenless collector answers to
# other sites may not frame the dashboard (clickjacking) nor learn its URLs from Referer
PAGE_HEADERS = ((b"x-frame-options", b"DENY"), (b"content-security-policy", b"frame-ancestors 'none'"),
                (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"same-origin"))


def is_loopback(host: str) -> bool:
    """True for names and addresses only this machine reaches; "" means every interface (False)."""
    host = host.strip().strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse (ValueError) to serve anything but loopback without a token, or with a token that
    headers cannot carry as typed."""
    if token and not (token.isascii() and token.isprintable() and " " not in token):
        raise ValueError("the token must be printable ASCII without spaces (it travels in HTTP headers), "
                         "e.g. --token \"$(openssl rand -hex 16)\"")
    if not token and not is_loopback(host):
        where = "every interface" if host.strip() in ("", "0.0.0.0", "::") else host
        raise ValueError(f"binding {where!r} without a token exposes every run to the network: pass "
                         "--token T (or set FORKSIGHT_TOKEN) and send 'Authorization: Bearer T', "
                         "or bind 127.0.0.1")


def _split_host(value: str, scheme: str) -> tuple[str, int | None]:
    """'[::1]:8050' -> ('::1', 8050); anything but host[:port] -> ('', None) (refused by callers)."""
    if any(c in value for c in "@/?#\\ \t"):
        return "", None
    try:
        parts = urlsplit(f"{scheme}://{value}")
        return parts.hostname or "", parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        return "", None


def host_allowed(host: str, port: int | None, server) -> bool:
    """Without a token, a Host (or Origin) names exactly localhost, 127.0.0.1, [::1] or the bound
    address, with the bound port (`server`: the ASGI scope's (host, port) of the listening socket);
    not evil.localhost, 127.0.0.2, a missing port or another port."""
    bound_host, bound_port = (server[0], server[1]) if server else (None, None)
    names = set(LOOPBACK_NAMES) | ({str(bound_host).strip("[]").lower()} if bound_host else set())
    return host.lower() in names and (bound_port is None or port == bound_port)


def _cookie_token(header: str) -> str | None:
    # by hand: http.cookies raises on a malformed header, and one bad cookie must not lock anyone out
    for part in header.split(";"):
        name, sep, value = part.partition("=")
        if sep and name.strip() == TOKEN_COOKIE:
            return unquote(value.strip().strip('"'))
    return None


class GuardMiddleware:
    """Pure ASGI: token (401), Host/Origin on the tokenless default (403), media type of writes
    (400/415) and the body limit (413, counted while the body streams in)."""

    def __init__(self, app, token: str | None, max_body: int = MAX_BODY_BYTES):
        # without a token only loopback is bound (check_bind), so loopback names are all it answers to
        self.app, self.token, self.max_body = app, token, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":      # nothing here speaks it: no unguarded way in
            return await send({"type": "websocket.close", "code": 1008})
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers: dict[str, str] = {}
        for key, value in scope.get("headers", []):
            headers[key.decode("latin-1").lower()] = value.decode("latin-1")
        refusal = self._auth(scope, headers) if self.token else self._same_origin(scope, headers)
        if refusal is None:
            refusal = self._media_type(scope, headers) or self._declared_length(headers)
        if refusal is not None:
            return await _refuse(send, *refusal)
        if self.token and self._token_in_query(scope) is not None:
            if _is_navigation(scope, headers):
                return await self._redirect_without_token(scope, send)
            return await self._limited(scope, receive, _with_cookie(send, self.token))
        return await self._limited(scope, receive, send)

    # -- who may ask ------------------------------------------------------------------------
    def _auth(self, scope, headers: dict) -> tuple[int, str] | None:
        auth = headers.get("authorization", "")
        supplied = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        if supplied is None and "cookie" in headers:
            supplied = _cookie_token(headers["cookie"])
        if supplied is None:
            supplied = self._token_in_query(scope)
        if supplied is not None and hmac.compare_digest(supplied.encode(), self.token.encode()):
            return None
        what = "missing" if supplied is None else "wrong"
        return 401, (f"{what} token: send 'Authorization: Bearer <token>' "
                     "(browsers: open the dashboard once with ?token=<token>)")

    @staticmethod
    def _token_in_query(scope) -> str | None:
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
        return query.get("token")

    def _same_origin(self, scope, headers: dict) -> tuple[int, str] | None:
        scheme = scope.get("scheme", "http")
        host_header = headers.get("host")
        server = scope.get("server")
        bound = f":{server[1]}" if server and server[1] else ""
        if host_header is not None:
            host, port = _split_host(host_header, scheme)
            if not host_allowed(host, port, server):
                return 403, (f"Host {host_header!r} is not this collector's address: without a token it "
                             f"answers only 127.0.0.1{bound}, localhost{bound} and [::1]{bound}; open it by one "
                             "of those, or start `forksight serve --token T` to serve other names")
        origin = headers.get("origin")
        if origin is None:
            return None
        parts = urlsplit(origin) if "://" in origin else None
        same = False
        if parts is not None and parts.scheme in DEFAULT_PORTS:
            o_host, o_port = _split_host(parts.netloc, parts.scheme)
            h_host, h_port = _split_host(host_header or "", scheme)
            same = host_allowed(o_host, o_port, server) and (o_host.lower(), o_port) == (h_host.lower(), h_port)
        if same:
            return None
        return 403, (f"cross-origin request from {origin!r} refused: without a token the collector "
                     "answers only its own pages and non-browser clients; start `forksight serve "
                     "--token T` to let other origins in with the token")

    # -- what they send ---------------------------------------------------------------------
    def _media_type(self, scope, headers: dict) -> tuple[int, str] | None:
        if scope.get("method") not in WRITE_METHODS or not _has_body(headers):
            return None
        arrow = ARROW_ROUTE.fullmatch(scope.get("path", "")) is not None
        wanted = ARROW_MEDIA_TYPE if arrow else "application/json"
        what = (f"an Arrow IPC stream with 'Content-Type: {ARROW_MEDIA_TYPE}'" if arrow
                else "JSON with 'Content-Type: application/json'")
        given = headers.get("content-type")
        if given is None:
            return 400, f"the body has no Content-Type: send {what}"
        if given.split(";")[0].strip().lower() != wanted:
            return 415, f"Content-Type {given!r} is not accepted here: send {what}"
        return None

    def _declared_length(self, headers: dict) -> tuple[int, str] | None:
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            return 413, f"body is {length} bytes; the limit is {self.max_body}: send smaller batches"
        return None

    async def _limited(self, scope, receive, send):
        """Run the app, counting body bytes as they arrive: past the limit it answers 413 itself
        and the app sees the client gone (whatever it answers then is dropped)."""
        state = {"received": 0, "refused": False, "started": False}

        async def counted_receive():
            if state["refused"]:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > self.max_body:
                    state["refused"] = True
                    if not state["started"]:
                        state["started"] = True
                        await send_json(send, 413, f"body is over {self.max_body} bytes (the limit): "
                                        "send smaller batches")
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message):
            if state["refused"]:
                return
            if message["type"] == "http.response.start":
                state["started"] = True
                given = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in PAGE_HEADERS if k not in given]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except Exception:
            if not state["refused"]:   # the app gave up on the body we cut off: answered already
                raise

    async def _redirect_without_token(self, scope, send) -> None:
        # the token must not stay in the address bar (history, screenshots): set the cookie, drop it
        pairs = [(k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                                              keep_blank_values=True) if k != "token"]
        path = "/" + scope.get("path", "/").lstrip("/")   # never //host: no open redirect
        location = quote(path) + (f"?{urlencode(pairs)}" if pairs else "")
        await _with_cookie(send, self.token)({"type": "http.response.start", "status": 303, "headers": [
            (b"location", location.encode("latin-1")), (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


def _has_body(headers: dict) -> bool:
    return "transfer-encoding" in headers or headers.get("content-length", "0").strip() not in ("", "0")


def _is_navigation(scope, headers: dict) -> bool:
    """A browser opening a page (not an API client): only those are redirected."""
    if scope.get("method") not in ("GET", "HEAD"):
        return False
    return headers.get("sec-fetch-mode") == "navigate" or "text/html" in headers.get("accept", "")


def _with_cookie(send, token: str):
    # SameSite=Lax, not Strict: a link to /?token=T opened from chat or mail is a cross-site
    # navigation, and Strict would drop the cookie on the redirect that follows it
    cookie = f"{TOKEN_COOKIE}={quote(token, safe='')}; Path=/; HttpOnly; SameSite=Lax".encode("latin-1")

    async def send_with_cookie(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", cookie)]}
        await send(message)
    return send_with_cookie


async def _refuse(send, status: int, detail: str) -> None:
    """send_json for a request refused before its body is read: if the client's broken body
    (a bad chunk) made the server answer and close first, there is no one left to tell."""
    try:
        await send_json(send, status, detail)
    except Exception as exc:  # noqa: BLE001 - h11's LocalProtocolError: the connection is closing
        if "MUST_CLOSE" not in str(exc) and "CLOSED" not in str(exc):
            raise


async def send_json(send, status: int, detail: str) -> None:
    """Answer {"detail": ...} with `status` straight from ASGI."""
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:                 # RFC 6750: say which scheme the token goes in
        headers.append((b"www-authenticate", b'Bearer realm="forksight"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

