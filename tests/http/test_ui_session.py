"""Signing in to the dashboard (app/ui/session.py), over HTTP against a live service: a token entered once
becomes a signed session cookie with the token's roles and queues; sign-out, expiry, a tampered cookie and
a revoked token each end it; cross-site and Host checks apply to the sign-in form as to every post."""

from __future__ import annotations

import hashlib
import time
from http.cookies import SimpleCookie
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from itsdangerous import TimestampSigner

from app.ui.session import COOKIE, SALT
from tests.helpers import bearer, enqueue, make_dead

pytestmark = pytest.mark.anyio

TOKENS = {"v-secret": "viewer", "a-secret": "admin", "w-secret": "worker"}
SECRET = "a session secret of the tests, long enough"
BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


async def sign_in(http: httpx.AsyncClient, token: str, next_page: str = "/ui") -> httpx.Response:
    """The sign-in form, posted as a browser posts it (same origin)."""
    return await http.post(
        "/ui/sign-in",
        data={"token": token, "next": next_page},
        headers={"Sec-Fetch-Site": "same-origin", **BROWSER},
    )


def session_cookie(response: httpx.Response) -> SimpleCookie:
    cookie = SimpleCookie()
    for header in response.headers.get_list("set-cookie"):
        cookie.load(header)
    return cookie


def as_cookie(value: str) -> dict[str, str]:
    return {"Cookie": f"{COOKIE}={value}"}


async def signed_in(http: httpx.AsyncClient, token: str) -> dict[str, str]:
    r = await sign_in(http, token)
    assert r.status_code == 303, r.text
    return as_cookie(session_cookie(r)[COOKIE].value)


async def test_sign_in_gives_a_signed_http_only_strict_cookie_and_sign_out_ends_it(start_service, db):
    service = start_service(tokens=TOKENS, session_max_age=3600)
    async with httpx.AsyncClient(base_url=service.url) as http:
        # A browser with no session is sent to the sign-in page, and comes back where it was going.
        r = await http.get("/ui/dead?queue=q", headers=BROWSER)
        assert r.status_code == 303
        assert r.headers["location"] == "/ui/sign-in?next=%2Fui%2Fdead%3Fqueue%3Dq"
        form = await http.get(r.headers["location"], headers=BROWSER)
        assert form.status_code == 200 and 'method="post" action="/ui/sign-in"' in form.text
        assert 'type="password"' in form.text and 'value="/ui/dead?queue=q"' in form.text
        # A program with no credentials is still told so in a problem (not sent to a form).
        assert (await http.get("/ui")).status_code == 401

        r = await sign_in(http, "a-secret", "/ui/dead?queue=q")
        assert r.status_code == 303 and r.headers["location"] == "/ui/dead?queue=q"
        morsel = session_cookie(r)[COOKIE]
        assert morsel["httponly"] and morsel["samesite"].lower() == "strict" and morsel["path"] == "/ui"
        assert morsel["max-age"] == "3600"
        assert not morsel["secure"]  # plain HTTP here; over HTTPS it is Secure
        value = morsel.value
        # Neither the token nor its plain SHA-256 travels in the cookie.
        assert "a-secret" not in value and hashlib.sha256(b"a-secret").hexdigest() not in value
        admin = as_cookie(value)

        page = await http.get("/ui", headers=admin)
        assert page.status_code == 200 and 'action="/ui/sign-out"' in page.text
        assert (await http.post("/ui/queues/q/pause", headers=admin)).status_code == 303
        assert await db.fetchval("SELECT paused FROM jobq.queues WHERE name = 'q'") is True
        # The session opens the dashboard only, not the API.
        assert (await http.get("/queues", headers=admin)).status_code == 401

        # Behind a proxy that ends TLS (one uvicorn trusts: FORWARDED_ALLOW_IPS, 127.0.0.1 by default).
        https = await http.post(
            "/ui/sign-in",
            data={"token": "a-secret"},
            headers={"Sec-Fetch-Site": "same-origin", "X-Forwarded-Proto": "https"},
        )
        assert session_cookie(https)[COOKIE]["secure"]

        out = await http.post("/ui/sign-out", headers={**admin, "Sec-Fetch-Site": "same-origin"})
        assert out.status_code == 303 and out.headers["location"].startswith("/ui/sign-in")
        cleared = session_cookie(out)[COOKIE]
        assert cleared.value == "" and cleared["max-age"] == "0" and cleared["path"] == "/ui"


async def test_a_viewer_session_reads_and_presses_nothing(start_service, db):
    service = start_service(tokens=TOKENS)
    async with httpx.AsyncClient(base_url=service.url) as http:
        async with httpx.AsyncClient(base_url=service.url, headers=bearer("a-secret")) as admin:
            job_id = await make_dead(admin, "q")
        viewer = await signed_in(http, "v-secret")
        page = await http.get(f"/ui/jobs/{job_id}", headers=viewer)
        assert page.status_code == 200 and 'action="/ui/dead/' not in page.text
        for action in (f"dead/{job_id}/retry", "queues/q/pause"):
            r = await http.post(f"/ui/{action}", headers={**viewer, "Sec-Fetch-Site": "same-origin"})
            assert r.status_code == 403, action
        assert await db.fetchval("SELECT status FROM jobq.all_jobs WHERE id = $1", job_id) == "dead"


async def test_tokens_that_open_no_dashboard_get_no_cookie(start_service):
    service = start_service(tokens=TOKENS)
    async with httpx.AsyncClient(base_url=service.url) as http:
        for token, status, said in (
            ("not-a-token", 401, "not one of this service"),
            ("", 400, "Enter a token"),
            ("w-secret", 403, "takes a viewer or admin token"),
        ):
            r = await sign_in(http, token)
            assert r.status_code == status, token
            assert said in r.text and 'action="/ui/sign-in"' in r.text
            assert COOKIE not in session_cookie(r)


async def test_expired_and_tampered_cookies_are_refused(start_service):
    service = start_service(tokens=TOKENS, session_secret=SECRET, session_max_age=600)
    async with httpx.AsyncClient(base_url=service.url) as http:
        value = (await signed_in(http, "a-secret"))["Cookie"].split("=", 1)[1]
        assert (await http.get("/ui", headers=as_cookie(value))).status_code == 200

        # The same session signed 11 minutes ago, with the service's own secret: past its 10 minutes.
        class Earlier(TimestampSigner):
            def get_timestamp(self) -> int:
                return int(time.time()) - 660

        signer = TimestampSigner(SECRET, salt=SALT)
        session = signer.unsign(value).decode()
        stale = Earlier(SECRET, salt=SALT).sign(session).decode()
        # The first character: every bit of it counts (the signature's last base64 character carries
        # unused bits, so changing it may change nothing).
        tampered = ("A" if value[0] != "A" else "B") + value[1:]
        forged = TimestampSigner("another secret entirely, long enough", salt=SALT).sign(session).decode()
        for cookie in (stale, tampered, forged, "garbage", session):
            r = await http.get("/ui/jobs", headers={**as_cookie(cookie), **BROWSER})
            assert r.status_code == 303, cookie
            where = urlsplit(r.headers["location"])
            assert where.path == "/ui/sign-in" and parse_qs(where.query)["next"] == ["/ui/jobs"]
            assert session_cookie(r)[COOKIE]["max-age"] == "0"  # the bad cookie is removed
            assert (await http.get("/ui/jobs", headers=as_cookie(cookie))).status_code == 401
            r = await http.post(
                "/ui/queues/q/pause", headers={**as_cookie(cookie), "Sec-Fetch-Site": "same-origin"}
            )
            assert r.status_code == 401
            # A browser's press of a button: to sign in, then back to the page the button was on.
            r = await http.post(
                "/ui/queues/q/pause?next=/ui/queues/q",
                headers={**as_cookie(cookie), "Sec-Fetch-Site": "same-origin", **BROWSER},
            )
            assert r.status_code == 303
            assert parse_qs(urlsplit(r.headers["location"]).query)["next"] == ["/ui/queues/q"]
        expired = await http.get(
            (await http.get("/ui", headers={**as_cookie(stale), **BROWSER})).headers["location"],
            headers=BROWSER,
        )
        assert "session has ended" in expired.text


async def test_a_link_from_another_site_offers_to_continue(start_service):
    """A SameSite=Strict cookie does not come with a link from another site: the sign-in page it lands
    on links to the page asked for, and that link (same site) brings the session along."""
    service = start_service(tokens=TOKENS)
    async with httpx.AsyncClient(base_url=service.url) as http:
        linked = await http.get(
            "/ui/sign-in?next=/ui/dead", headers={"Sec-Fetch-Site": "cross-site", **BROWSER}
        )
        assert '<a href="/ui/dead">continue to /ui/dead</a>' in linked.text
        typed = await http.get("/ui/sign-in?next=/ui/dead", headers={"Sec-Fetch-Site": "none", **BROWSER})
        assert "continue to" not in typed.text


async def test_a_revoked_token_ends_its_sessions_and_the_others_survive_restarts(start_service):
    """Without JOBQ_SESSION_SECRET the key comes from the tokens: the same on every replica and after a
    restart with the same tokens. With it, removing a token still ends that token's sessions."""
    for secret in (None, SECRET):
        first = start_service(tokens=TOKENS, session_secret=secret)
        async with httpx.AsyncClient(base_url=first.url) as http:
            viewer = await signed_in(http, "v-secret")
            admin = await signed_in(http, "a-secret")
        replica = start_service(tokens=TOKENS, session_secret=secret)  # another replica, or a restart
        first.stop()
        async with httpx.AsyncClient(base_url=replica.url) as http:
            assert (await http.get("/ui", headers=viewer)).status_code == 200, secret
            assert (await http.get("/ui", headers=admin)).status_code == 200, secret
        replica.stop()
        revoked = start_service(tokens={"a-secret": "admin"}, session_secret=secret)
        async with httpx.AsyncClient(base_url=revoked.url) as http:
            assert (await http.get("/ui", headers=viewer)).status_code == 401, secret
            if secret is not None:  # a secret of its own: the remaining tokens' sessions go on
                assert (await http.get("/ui", headers=admin)).status_code == 200
        revoked.stop()


async def test_a_session_has_its_tokens_queues(start_service):
    tokens = {"a-secret": "admin", "mail": {"roles": ["viewer"], "queues": ["mail-*"]}}
    service = start_service(tokens=tokens)
    async with httpx.AsyncClient(base_url=service.url, headers=bearer("a-secret")) as admin:
        mine = (await enqueue(admin, "mail-out"))["id"]
        theirs = (await enqueue(admin, "billing"))["id"]
    async with httpx.AsyncClient(base_url=service.url) as http:
        scoped = await signed_in(http, "mail")
        listed = await http.get("/ui/jobs", headers=scoped)
        assert f'data-job="{mine}"' in listed.text and f'data-job="{theirs}"' not in listed.text
        assert (await http.get(f"/ui/jobs/{theirs}", headers=scoped)).status_code == 404
        assert (await http.get("/ui/queues/billing", headers=scoped)).status_code == 403
        assert (await http.get("/ui/queues/mail-out", headers=scoped)).status_code == 200


async def test_sign_in_refused_from_other_sites_and_hosts(start_service):
    service = start_service(tokens=TOKENS)
    async with httpx.AsyncClient(base_url=service.url) as http:
        for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}):
            r = await http.post("/ui/sign-in", data={"token": "a-secret"}, headers=headers)
            assert r.status_code == 403 and COOKIE not in session_cookie(r)
        r = await http.post("/ui/sign-out", headers={"Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403
        r = await http.post("/ui/sign-in", data={"token": "a-secret"}, headers={"Host": "evil.example"})
        assert r.status_code == 400 and COOKIE not in session_cookie(r)
        # Where it sends the browser afterwards is a page of the dashboard, never another site.
        for elsewhere in ("https://evil.example/ui", "//evil.example/ui", "/queues"):
            r = await sign_in(http, "a-secret", elsewhere)
            assert r.headers["location"] == "/ui", elsewhere


async def test_without_tokens_there_is_nothing_to_sign_in_to(service):
    async with httpx.AsyncClient(base_url=service.url) as http:
        r = await http.get("/ui/sign-in", headers=BROWSER)
        assert r.status_code == 303 and r.headers["location"] == "/ui"
        assert (await http.get("/ui", headers=BROWSER)).status_code == 200


def test_a_short_session_secret_is_refused_without_showing_it():
    from pydantic import ValidationError

    from app.settings import Settings

    with pytest.raises(ValidationError) as refused:
        Settings(session_secret="hunter2")
    assert "JOBQ_SESSION_SECRET needs at least 16 characters" in str(refused.value)
    assert "hunter2" not in str(refused.value)
