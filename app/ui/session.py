"""Dashboard sessions: a token entered once in the sign-in form becomes a signed cookie, so a browser can
use the dashboard without an `Authorization` header on every request.

The cookie holds no token. It holds the token's *session id*, an HMAC of the token's SHA-256 digest under
the session key, signed with a timestamp by itsdangerous (``TimestampSigner``). Each request looks the id up
among the configured tokens, so a session has exactly its token's roles and queues as they are configured
now: a token removed from JOBQ_TOKENS (or its file) ends its sessions at the next restart of each replica,
and a token whose roles change takes its sessions along. A cookie older than JOBQ_SESSION_MAX_AGE, signed
with another key, or altered in any byte, is no session.

The key is JOBQ_SESSION_SECRET when set. Unset (the default), it is derived from the configured tokens
(an HMAC of their digests): every replica with the same tokens derives the same key, so sessions work on
any of them and survive restarts; changing the tokens in any way (adding one too) ends every session.
Deriving it needs every token, so no holder of one token can forge a session for another.

The cookie is ``HttpOnly`` (scripts cannot read it), ``SameSite=Strict`` (a browser sends it with no
request another site starts, links included), ``Path=/ui`` (it opens the dashboard, not the API) and
``Secure`` when the request came over HTTPS (or through a proxy that says so in X-Forwarded-Proto and
that uvicorn trusts: FORWARDED_ALLOW_IPS, 127.0.0.1 by default). Posts from another site, the sign-in form's
included, are refused before any route sees them (app/http/middleware/origin.py). Signing out deletes the
cookie from the browser; a copy taken from it stays valid until it expires, as with any signed cookie that the
server does not store."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

from itsdangerous import BadSignature, SignatureExpired, TimestampSigner

from app.core.access import Grant, Tokens

COOKIE = "jobq_session"
PATH = "/ui"
# Separates these signatures from any other use of the same secret.
SALT = "jobq.ui.session"
_DERIVED = b"jobq dashboard sessions"


class Sessions:
    """Issue and read session cookies for the configured `tokens` (see the module's docstring)."""

    def __init__(self, tokens: Tokens, secret: str | None, max_age: float) -> None:
        key = secret.encode() if secret else _derived_key(tokens.digests())
        self.max_age = int(max_age)
        self._key = key
        self._signer = TimestampSigner(key, salt=SALT)
        self._grants = {self._id(digest): grant for digest, grant in tokens.digests().items()}

    def _id(self, digest: bytes) -> str:
        mac = hmac.new(self._key, digest, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def cookie_for(self, token: str) -> str:
        """The cookie's value for a session of `token` (a configured one), signed now."""
        return self._signer.sign(self._id(hashlib.sha256(token.encode()).digest())).decode()

    def grant_of(self, cookie: str) -> Grant | None:
        """The Grant of the token a cookie is a session of; None when it is expired, not signed with this
        key, altered, or of a token no longer configured."""
        try:
            session = self._signer.unsign(cookie, max_age=self.max_age).decode()
        except (SignatureExpired, BadSignature):
            return None
        return self._grants.get(session)


def _derived_key(digests: Mapping[bytes, Grant]) -> bytes:
    """A key from every configured token (their digests, in a fixed order): the same on each replica."""
    return hmac.new(_DERIVED, b"".join(sorted(digests)), hashlib.sha256).digest()
