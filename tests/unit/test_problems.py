"""Every error of app/core/errors.py has its HTTP status in app/http/problems.py's one table, the statuses
jobq's contract gives them (a lost lease is 409 however it is reached), and an error that refuses the
request is a 4xx: the service retries a shared statement's items one by one on exactly those."""

from app.core import errors
from app.http.problems import STATUSES, ProblemCode, status_of

ERRORS = [cls for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, errors.JobqError)]


def test_every_error_has_its_status():
    statuses = {cls.__name__: status_of(cls("why")) for cls in ERRORS}
    assert statuses == {
        "JobqError": 500,
        "Refusal": 500,
        "Unauthorized": 401,
        "Forbidden": 403,
        "NotFound": 404,
        "LeaseLost": 409,
        "Conflict": 409,
        "PayloadTooLarge": 413,
        "Invalid": 422,
        "Unavailable": 503,
    }


def test_refusals_are_the_4xx_errors():
    for cls in ERRORS:
        if cls is not errors.Refusal:
            assert issubclass(cls, errors.Refusal) == (400 <= status_of(cls("why")) < 500), cls


def test_the_table_speaks_problem_codes():
    assert set(STATUSES) <= set(ProblemCode)
