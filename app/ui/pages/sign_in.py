"""The sign-in form: a token, once, for a session cookie."""

from __future__ import annotations

from app.ui.pages.layout import duration, esc, layout


def sign_in_page(next_page: str, max_age: int, *, flash: str | None = None, linked: bool = False) -> str:
    """The sign-in form: a token, once, for a session of `max_age` seconds; then on to `next_page`.
    `linked`: the browser came by a link from another site, which carried no session cookie: it may be
    signed in already, and following a link of this page tells."""
    already = (
        f'<p class="flash">Signed in already? A link from another site does not bring the session along: '
        f'<a href="{esc(next_page)}">continue to {esc(next_page)}</a>.</p>'
        if linked
        else ""
    )
    body = (
        f"<h1>Sign in</h1>{already}"
        '<form class="sign-in" method="post" action="/ui/sign-in">'
        f'<input type="hidden" name="next" value="{esc(next_page)}">'
        '<p><label for="token">Token</label><br><input id="token" name="token" type="password" '
        'autocomplete="current-password" required autofocus></p>'
        "<p><button>Sign in</button></p></form>"
        f'<p class="meta">A token with the viewer or admin role. This browser stays signed in for '
        f"{duration(max_age)}, or until you sign out.</p>"
    )
    return layout("Sign in", body, flash=flash, nav=False)
