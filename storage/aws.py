"""The AWS boundary: every boto3 client is built here and every AWS error is mapped once, to
:class:`CloudError` (raised with what was being done)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


# AWS's answers that mean "not now" rather than "not this": throttled, or the service failed.
_TRANSIENT_CODES = frozenset({"Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException",
                              "SlowDown", "ServiceUnavailable", "InternalError", "InternalFailure", "RequestTimeout",
                              "RequestTimeoutException", "PriorRequestNotComplete"})


class CloudError(RuntimeError):
    """An AWS call failed; the message says which call and why. ``transient``: AWS could not be reached or
    answered "not now" (throttled, a 5xx) — worth retrying later, unlike a refusal or a missing credential."""

    def __init__(self, message: str, code: str | None = None, transient: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.transient = transient


def call(what: str, fn: Callable[..., T], /, **kwargs: Any) -> T:
    """``fn(**kwargs)``, with botocore's errors turned into one :class:`CloudError` naming ``what``."""
    from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as AwsConnectionError

    try:
        return fn(**kwargs)
    except ClientError as exc:
        err = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        transient = err.get("Code") in _TRANSIENT_CODES or status >= 500
        raise CloudError(f"{what}: {err.get('Code', 'error')}: {err.get('Message', exc)}", err.get("Code"),
                         transient) from exc
    except BotoCoreError as exc:  # no credentials, endpoint unreachable, bad region, …
        raise CloudError(f"{what}: {exc}", transient=isinstance(exc, (AwsConnectionError, HTTPClientError))) from exc


def reraise_as(error: type[Exception], where: str, what: str, fn: Callable, *args: Any) -> Any:
    """``fn(*args)``, its :class:`CloudError` raised again as ``error`` ("where: what: why"): how a
    package maps the storage layer's one error type to its own."""
    try:
        return fn(*args)
    except CloudError as exc:
        raise error(f"{where}: {what}: {exc}") from exc


def aws_client(service: str, region: str | None = None, endpoint_url: str | None = None) -> Any:
    """A boto3 client with bounded retries and timeouts, the one way dinrec makes them (region and
    endpoint: boto3's environment unless given — AWS_ENDPOINT_URL points it at moto in tests)."""
    import boto3
    from botocore.config import Config

    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return boto3.client(service, region_name=region, endpoint_url=endpoint_url,
                        config=Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=5,
                                      read_timeout=30))


def s3_client(region: str | None = None, endpoint_url: str | None = None) -> Any:
    return aws_client("s3", region, endpoint_url)
