"""Browser safety for a service without auth (the embedded default).

Without API keys, the only thing between a web page the user visits and the service is
the browser's own rules, and those let a page send a cross-site form POST (it cannot read
the answer, but a cancel needs no answer) and let a DNS-rebound name reach 127.0.0.1. So,
with auth off:

- a state-changing request (anything but GET, HEAD, OPTIONS) that a browser marks as
  cross-site (`Sec-Fetch-Site`), or whose `Origin` is not one of the allowed hosts, is a
  403 (clients outside a browser send neither header and are not affected);
- a `Host` header that is not an allowed host is refused (starlette's
  TrustedHostMiddleware), so a rebound name cannot talk to the service.

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


def allowed_hosts(bind_host: str, extra: Collection[str] = ()) -> list[str]:
    """The loopback names, the address the service binds (unless it is a wildcard) and
    the names an admin added."""
    hosts = [*LOOPBACK_HOSTS, *extra]
    if bind_host not in ("0.0.0.0", "::", ""):
        hosts.append(bind_host)
    return hosts


class CrossSiteGuard(BaseHTTPMiddleware):
    def __init__(self, app: ASGIApp, *, hosts: Collection[str] | None = None) -> None:
        super().__init__(app)
        # None: any Origin host that equals the request's own Host.
        self._hosts = frozenset(hosts) if hosts is not None else None

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
        origin_host = urlsplit(origin).hostname or ""
        if self._hosts is not None:
            return origin_host not in self._hosts and f"[{origin_host}]" not in self._hosts
        return origin_host != (urlsplit(f"//{request.headers.get('host', '')}").hostname or "")
