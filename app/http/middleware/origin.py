"""Requests a browser was made to send: refused before any route answers.

Without tokens (the default on loopback) two attacks reach a local jobq through the browser of someone
who can reach it, from any web page they visit:

- **Cross-site request forgery.** A plain HTML form on another site can make the browser POST to
  ``http://127.0.0.1:8000/queues/q/pause``: no preflight, no body needed. The browser says where such a
  request comes from, so state-changing requests (every method but GET, HEAD and OPTIONS) are judged
  as Go 1.25's ``net/http.CrossOriginProtection`` judges them (Django's Origin check is the same idea):
  with ``Sec-Fetch-Site`` (every current browser), only ``same-origin`` and ``none`` (the user's own
  doing: a bookmark, the address bar) pass; without it, an ``Origin`` must name the host the request
  came to; a request with neither header is not a browser's (curl, SDKs, workers, jobq's own clients)
  and passes. Origins listed in ``trusted_origins`` pass too: pages of another origin the operator runs.
  Refused: ``403 forbidden``. Reads are not refused: without CORS headers a page of another origin
  cannot read what it asked for.
- **DNS rebinding.** A page on attacker.example whose name its owner then points at 127.0.0.1 is, for
  the browser, of the same origin as everything it fetches from "attacker.example": it can read and
  write the whole API, and the checks above cannot tell. But its requests say ``Host: attacker.example``.
  So every request's Host, port aside, must be one of ``allowed_hosts`` (by default the loopback names
  when the service listens on loopback, any otherwise, where tokens are required); another is refused
  with ``400 disallowed_host``, GETs included, as Django's ``ALLOWED_HOSTS`` does. ``/healthz`` and
  ``/readyz`` answer any host: load balancers and Kubernetes probe by address (``Host: 10.0.0.7:8000``),
  and they tell a rebinding page nothing it could use. A request with no Host at all (HTTP/1.0) passes:
  browsers always send one.

Both checks live in one ASGI middleware, outside app/http/fastpath/hot.py's hot routes (which answer before
FastAPI's routing) and inside the access log, so refusals are counted and logged like any answer. The SQS API
(``POST /``) and the dashboard's buttons are covered like every other route; the SQS API's queue URLs name the
request's Host, which is vetted by then. The SQS API's Query protocol over GET, which can act, is judged by
the same rule (``cross_origin``) in app/sqs/router.py, since this middleware lets GETs through as reads."""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.http.problems import problem
from app.settings import Settings, is_loopback

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The headers both checks read.
HEADERS = frozenset({b"host", b"origin", b"sec-fetch-site"})
# Sec-Fetch-Site values of requests a page of this very origin made, or the user made directly.
SAME_SITE = frozenset({b"same-origin", b"none"})
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
# Routes that answer any Host: probes by address, which reveal nothing.
ANY_HOST_PATHS = frozenset({"/healthz", "/readyz"})

# A Host header: a name (letters, digits, dots, hyphens; underscores, as Docker's service names have)
# or a bracketed IPv6 address, then an optional port. Anything else is no host jobq answers to.
_HOST = re.compile(r"(?:(?P<name>[a-z0-9._-]+)|\[(?P<ipv6>[0-9a-f:.]+)\])(?::[0-9]*)?")


def allowed_hosts(settings: Settings) -> list[str]:
    """The configured host names, else the default for the address the service listens on."""
    if settings.allowed_hosts is not None:
        return settings.allowed_hosts
    if is_loopback(settings.host):
        return [*LOOPBACK_NAMES, settings.host]  # 127.0.0.2 is loopback too, and answers to its own name
    return ["*"]


def host_name(host: str) -> str | None:
    """The name a Host header names, lowercased, without port, brackets or final dot; None if malformed."""
    match = _HOST.fullmatch(host.strip().lower())
    if match is None:
        return None
    return match["ipv6"] or match["name"].removesuffix(".")


def _entry(host: str) -> str:
    """An allowed_hosts entry as host_name spells a header's name (`.example.com` keeps its dot)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.strip("[]")
    return host if host in ("*", ".") else host.removesuffix(".")


class HostCheck:
    """Whether a Host header names one of `allowed` (see ``allowed_hosts`` for what the entries mean)."""

    def __init__(self, allowed: Iterable[str]) -> None:
        entries = {_entry(host) for host in allowed if host.strip()}
        self.any = "*" in entries
        self.names = frozenset(entry for entry in entries if not entry.startswith("."))
        self.domains = tuple(entry for entry in entries if entry.startswith(".") and len(entry) > 1)
        # Headers already found allowed: a service sees a handful of them, and the check is per request.
        self._seen: set[bytes] = set()

    def allows(self, header: bytes) -> bool:
        if self.any or header in self._seen:
            return True
        name = host_name(header.decode("latin-1"))
        if name is None:
            return False
        allowed = name in self.names or any(
            name.endswith(domain) or name == domain[1:] for domain in self.domains
        )
        if allowed and len(self._seen) < 100:
            self._seen.add(header)
        return allowed


def cross_origin(headers: dict[bytes, bytes], trusted: frozenset[bytes]) -> str | None:
    """Why a state-changing request is one a browser sent from another origin; None when it is not.
    Go 1.25's CrossOriginProtection.Check, step by step (`trusted` is its AddTrustedOrigin)."""
    origin = headers.get(b"origin")
    if origin is not None and origin.lower() in trusted:
        return None
    site = headers.get(b"sec-fetch-site")
    if site is not None:
        if site in SAME_SITE:
            return None
        return f"Sec-Fetch-Site: {site.decode('latin-1')}"
    if origin is None:
        return None  # neither header: not a browser
    try:
        netloc = urlsplit(origin.decode("latin-1")).netloc
    except ValueError:
        netloc = ""
    if netloc and netloc.lower() == headers.get(b"host", b"").decode("latin-1").lower():
        return None
    return f"Origin: {origin.decode('latin-1')}"


class OriginCheck:
    """The middleware: refuse requests naming another host, then state-changing requests from another
    origin (see the module's docstring)."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str], trusted_origins: Iterable[str]) -> None:
        self.app = app
        self.hosts = HostCheck(allowed_hosts)
        # As Settings spells them: lowercase `scheme://host[:port]`, compared with Origin lowercased.
        self.trusted = frozenset(origin.encode("latin-1") for origin in trusted_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:  # names are lowercase in ASGI
            if name in HEADERS:
                headers.setdefault(name, value)  # of a repeated header, the first
        host = headers.get(b"host")
        if host is not None and not self.hosts.allows(host) and scope["path"] not in ANY_HOST_PATHS:
            return await _disallowed_host(host.decode("latin-1"))(scope, receive, send)
        if scope["method"] not in SAFE_METHODS:
            reason = cross_origin(headers, self.trusted)
            if reason is not None:
                return await _cross_origin(reason)(scope, receive, send)
        await self.app(scope, receive, send)


def _disallowed_host(host: str) -> Response:
    return problem(
        400,
        "disallowed_host",
        f"this service does not answer to the host {host!r}: a web page whose name was pointed at "
        "this machine would send such a request. If it is one of the service's names, add it to "
        "JOBQ_ALLOWED_HOSTS.",
        host=host,
    )


def _cross_origin(reason: str) -> Response:
    return problem(
        403,
        "forbidden",
        f"cross-origin request refused ({reason}): a page of another site made the browser send it. "
        "Call jobq from a server or a script (they send neither Origin nor Sec-Fetch-Site), or list "
        "the calling page's origin in JOBQ_TRUSTED_ORIGINS.",
    )
