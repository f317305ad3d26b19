"""Browser safety for a service without auth (the embedded default).

Without API keys, the only thing between a web page the user visits and the service is
the browser's own rules, and those let a page send a cross-site form POST (it cannot read
the answer, but a cancel needs no answer) and let a DNS-rebound name reach 127.0.0.1. So,
with auth off:

- a state-changing request (anything but GET, HEAD, OPTIONS) that a browser marks as
  cross-site (`Sec-Fetch-Site`), or whose `Origin` is not the service's own, is a 403
  (clients outside a browser send neither header and are not affected);
- a `Host` header that is not an allowed host is refused (starlette's
  TrustedHostMiddleware), so a rebound name cannot talk to the service.

An `Origin` is the service's own when its scheme and port are those the request reached the
service on (the request's scheme; the `Host` header's port, or 80 for http and 443 for
https when it has none) and its host is the `Host` header's or one of the allowed hosts.
Allowed hosts are names without ports (GANGWAY_ALLOWED_HOSTS): each means that name on the
scheme and port the service is served on, so `localhost` and `127.0.0.1` are the same
service on :8000, but a page from another local server (:9999), from plain http when the
service is reached over https, or an opaque `Origin: null` (a sandboxed frame, a file://
page) may change nothing. Host patterns (`*.example.com`) let a `Host` header in but never
an `Origin`. Behind a proxy, pass the `Host` header through and the scheme as
X-Forwarded-Proto (uvicorn trusts it from 127.0.0.1), or the browser's origin will not match.

With auth on, a browser never sends the API key on its own, so neither attack applies.
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import urlsplit

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from api.errors import error_response
from gangway.models import ErrorDetail

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")
DEFAULT_PORTS = {"http": 80, "https": 443}

WebOrigin = tuple[str, str, int]  # scheme, host (lower case, IPv6 without brackets), port


def allowed_hosts(bind_host: str, extra: Collection[str] = ()) -> list[str]:
    """The loopback names, the address the service binds (unless it is a wildcard) and
    the names an admin added."""
    hosts = [*LOOPBACK_HOSTS, *extra]
    if bind_host not in ("0.0.0.0", "::", ""):
        hosts.append(bind_host)
    return hosts


def web_origin(url: str) -> WebOrigin | None:
    """(scheme, host, port) of an http(s) URL, its port defaulted by its scheme; None for
    anything else (`null`, no host, a port that is no number): it matches no origin."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname, DEFAULT_PORTS[scheme] if port is None else port


class CrossSiteGuard(BaseHTTPMiddleware):
    def __init__(self, app: ASGIApp, *, hosts: Collection[str] | None = None) -> None:
        super().__init__(app)
        # None: only the request's own Host. Compared as urlsplit spells a hostname.
        self._hosts = frozenset(h.strip("[]").lower() for h in hosts or ())

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if request.method not in SAFE_METHODS and self._cross_site(request):
            detail = ErrorDetail(
                code="forbidden",
                message="cross-site requests may not change anything on this service",
                field="Origin",
            )
            return error_response(403, [detail])
        return await call_next(request)

    def _cross_site(self, request: Request) -> bool:
        if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            return True
        origin = request.headers.get("origin")
        if origin is None:
            return False
        theirs = web_origin(origin)
        ours = web_origin(f"{request.url.scheme}://{request.headers.get('host', '')}")
        return theirs is None or ours is None or not self._is_ours(theirs, ours)

    def _is_ours(self, theirs: WebOrigin, ours: WebOrigin) -> bool:
        """Same scheme and port as the request reached us on, and our host or an allowed
        one (see the module docstring)."""
        scheme, host, port = theirs
        own_scheme, own_host, own_port = ours
        return (scheme, port) == (own_scheme, own_port) and (
            host == own_host or host in self._hosts
        )
