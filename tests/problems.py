"""The one check of an error answer: RFC 9457 problem details with the contract's stable `code`."""

import httpx

PROBLEM_KEYS = {"type", "title", "status", "detail", "code"}


def assert_problem(response: httpx.Response, status: int, code: str) -> dict:
    """An RFC 9457 problem answer with this status and code."""
    assert response.status_code == status, response.text
    ctype = response.headers.get("content-type", "").split(";")[0].strip()
    assert ctype == "application/problem+json", ctype
    body = response.json()
    assert PROBLEM_KEYS <= body.keys(), body
    assert body["status"] == status and body["code"] == code, body
    assert isinstance(body["type"], str) and body["type"]
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str)
    assert "Traceback" not in response.text
    return body
