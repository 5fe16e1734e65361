"""The EC2 boundary: clients from settings, every call through storage.aws (one mapping of AWS errors).

Everything else in `spot` calls AWS through `call()`, so a missing credential, an
unreachable endpoint or an API refusal reaches the user as one clear message, never a botocore
traceback. ``endpoint_url`` points every client at a local endpoint (moto's server in tests).
"""

from __future__ import annotations

import datetime as dt
import statistics
from typing import Any

from dinrec.storage import aws_client, call

__all__ = ["Aws", "live_spot_prices"]


class Aws:
    """boto3 clients for one region (and optionally one endpoint), created lazily."""

    def __init__(self, region: str, endpoint_url: str | None = None) -> None:
        self.region, self.endpoint_url = region, endpoint_url
        self._clients: dict[str, Any] = {}

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = aws_client(service, self.region, self.endpoint_url)
        return self._clients[service]


def live_spot_prices(aws: Aws, instance_types: list[str], now: dt.datetime | None = None) -> dict[str, float]:
    """The current Linux spot price per instance type: the median over availability zones of each
    zone's latest price (the fleet may land in any of them). Types without a quote are left out."""
    ec2 = aws.client("ec2")
    now = now or dt.datetime.now(dt.UTC)
    latest: dict[tuple[str, str], tuple[dt.datetime, float]] = {}
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"InstanceTypes": instance_types, "ProductDescriptions": ["Linux/UNIX"],
                                  "StartTime": now - dt.timedelta(hours=6), "EndTime": now, "MaxResults": 1000}
        if token:
            kwargs["NextToken"] = token
        page = call("ec2.describe_spot_price_history", ec2.describe_spot_price_history, **kwargs)
        for rec in page.get("SpotPriceHistory", []):
            key = (rec["InstanceType"], rec.get("AvailabilityZone", ""))
            stamp, price = rec["Timestamp"], float(rec["SpotPrice"])
            if key not in latest or stamp > latest[key][0]:
                latest[key] = (stamp, price)
        token = page.get("NextToken")
        if not token:
            break
    per_type: dict[str, list[float]] = {}
    for (itype, _zone), (_stamp, price) in latest.items():
        per_type.setdefault(itype, []).append(price)
    return {t: statistics.median(p) for t, p in per_type.items() if p}
