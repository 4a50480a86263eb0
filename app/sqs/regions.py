"""Regions: an SQS queue belongs to a region, as on AWS, where the same name in two regions is two queues with
two URLs and two ARNs. A service serves the regions of ``JOBQ_AWS_REGIONS``; the first is its default.

Each region's queues are jobq queues, told apart by name:

- a queue of the default region (``us-east-1`` unless configured) is jobq's queue of the same name, its URL
  ``<base>/000000000000/<name>``, as before jobq had regions, so a service of one region is unchanged;
- a queue ``<name>`` of another served region ``<region>`` is jobq's queue ``<region>:<name>``, its URL
  ``<base>/queue/<region>/000000000000/<name>`` (LocalStack's path form), so jobq's own API, dashboard and
  workers reach it by that name. SQS names hold no colon, so no SQS queue of the default region can be
  taken for one of another;
- an ARN is ``arn:aws:sqs:<region>:000000000000:<name>``.

A request acts in one region (``of_request``): the one its signature's credential scope names, as on AWS,
where the endpoint a request is sent to is the region it is signed for. A request that names a queue of
another region, by its URL or an ARN, names no queue of its region: ``QueueDoesNotExist``, as SQS answers a
queue URL of another region. A URL without a region (``/000000000000/<name>``, also under a proxy's path
prefix) names the request's own region's queue; one that names its region (jobq's path form, or AWS's hosts
``sqs.<region>.amazonaws.com`` and ``<region>.queue.amazonaws.com``) names that region's.

A service with access keys (or tokens) refuses a signature for a region it does not serve
(app/sqs/auth.py), and so an ARN or URL naming one. A service without keys checks no signature: a request
signed for a region outside ``JOBQ_AWS_REGIONS``, or naming one, acts in the default region, as every
request did before jobq had regions, so that clients left on whatever region their SDK defaults to keep
working; an unsigned request acts in the region its queue URL names, else the default one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from app.core.limits import QUEUE_NAME_PATTERN
from app.sqs.protocol import ACCOUNT, invalid_parameter, missing_parameter

# A region as AWS spells one (us-east-1, us-gov-west-1, ap-southeast-2): a host's region is read only in that
# shape, so the host of a service named sqs.example.com is not taken for one of region "example".
AWS_REGION = re.compile(r"^[a-z]{2}(?:-[a-z]+)+-\d+$")
_PATH = re.compile(r"/queue/(?P<region>[^/]+)/[^/]+/[^/]+/?$")
_HOST = re.compile(r"^(?:sqs\.(?P<sqs>[^.]+)\.|(?P<queue>[^.]+)\.queue\.)")
_ARN = re.compile(r"^arn:[^:]+:sqs:(?P<region>[^:]*):[^:]*:(?P<name>[^:]+)$")


def url_parts(url: Any) -> tuple[str | None, str]:
    """The region a QueueUrl names (None: none) and the queue's name in it, its last path segment: any host,
    account and path prefix, so that URLs survive a proxy."""
    if not isinstance(url, str) or not url:
        raise missing_parameter("QueueUrl")
    name = url.rstrip("/").rsplit("/", 1)[-1]
    if not re.fullmatch(QUEUE_NAME_PATTERN, name):
        raise invalid_parameter(f"Value {url} for parameter QueueUrl is invalid. Reason: not a queue URL.")
    parts = urlsplit(url if "://" in url else f"//{url}")
    path = _PATH.search(parts.path)
    if path is not None:
        return path["region"], name
    host = _HOST.match(parts.hostname or "")
    region = host and (host["sqs"] or host["queue"])
    return (region if region and AWS_REGION.match(region) else None), name


def arn_parts(arn: Any, parameter: str) -> tuple[str, str]:
    """The region and the queue name an SQS ARN (``arn:aws:sqs:<region>:<account>:<name>``) names."""
    match = _ARN.match(arn) if isinstance(arn, str) else None
    if match is None or not re.fullmatch(QUEUE_NAME_PATTERN, match["name"]):
        raise invalid_parameter(f"Value {arn} for parameter {parameter} is invalid. Reason: not a queue ARN.")
    return match["region"], match["name"]


@dataclass(frozen=True, slots=True)
class Regions:
    """The regions a service serves (``served[0]`` the default), and whether it refuses others (``strict``:
    it has keys, and checks signatures) or reads them as the default region."""

    served: tuple[str, ...]
    strict: bool

    @property
    def default(self) -> str:
        return self.served[0]

    def served_as(self, region: str) -> str | None:
        """The served region `region` stands for: itself when served; else the default region on a service
        without keys, None (refused) on one with them."""
        if region in self.served:
            return region
        return None if self.strict else self.default

    def queue(self, region: str, name: str) -> str:
        """The jobq queue of the SQS queue `name` in the served region `region`."""
        return name if region == self.default else f"{region}:{name}"

    def split(self, queue: str) -> tuple[str, str]:
        """The region and the SQS name of the jobq queue `queue`."""
        head, colon, tail = queue.partition(":")
        if colon and head != self.default and head in self.served:
            return head, tail
        return self.default, queue

    def prefix(self, region: str) -> tuple[str, list[str]]:
        """How jobq names the queues of `region`: the prefix they all start with, and the prefixes none of
        them does (the other regions', when the default region's have none)."""
        if region != self.default:
            return f"{region}:", []
        return "", [f"{other}:" for other in self.served[1:]]

    def url(self, base: str, queue: str) -> str:
        region, name = self.split(queue)
        where = "" if region == self.default else f"/queue/{region}"
        return f"{base.rstrip('/')}{where}/{ACCOUNT}/{name}"

    def arn(self, queue: str) -> str:
        region, name = self.split(queue)
        return f"arn:aws:sqs:{region}:{ACCOUNT}:{name}"

    def of_request(self, signed_for: str | None, named: str | None) -> str:
        """The region a request acts in: the one it is signed for, else the one its queue URL or ARN names
        (`named`), else the default; as a served region (``served_as``; only a service without keys, which
        reads an unserved region as its default, has a request signed for one get here)."""
        for region in (signed_for, named):
            if region:
                return self.served_as(region) or self.default
        return self.default
