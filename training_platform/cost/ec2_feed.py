"""Optional live spot prices: EC2 spot price history (boto3) turned into the price model's spot figures.

Used when AWS credentials are configured; the shipped table is the fallback. The result is an
override table (same shape as `prices.yaml`) merged over the model, so the rest of the cost code
does not know where a price came from.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from statistics import fmean
from typing import Any

from training_platform.cost.prices import DAYS, HOURS_PER_WEEK, CostError, HourlyCurve, PriceModel, merge_tables


def instance_map(model: PriceModel) -> dict[str, tuple[str, int]]:
    """instance type -> (GPU type, GPUs per instance), from the price table."""
    return {e["instance"]: (gpu, int(e["gpus_per_instance"])) for gpu, e in model.table["gpus"].items()}


def fetch_spot_history(
    client: Any, instance_types: list[str], days: int = 14, now: datetime | None = None
) -> list[dict[str, Any]]:
    """All Linux spot price records of the last `days` days (every page of DescribeSpotPriceHistory)."""
    now = now or datetime.now(UTC)
    paginator = client.get_paginator("describe_spot_price_history")
    records: list[dict[str, Any]] = []
    for page in paginator.paginate(
        InstanceTypes=instance_types,
        ProductDescriptions=["Linux/UNIX"],
        StartTime=now - timedelta(days=days),
        EndTime=now,
    ):
        records.extend(page.get("SpotPriceHistory", []))
    return records


def hourly_profile(records: list[dict[str, Any]], gpus_per_instance: int) -> tuple[float, HourlyCurve]:
    """(mean $/GPU-hour, hour-of-week multipliers of mean 1.0); hours without a record take the previous hour's."""
    if not records:
        raise CostError("the EC2 spot price history is empty; check the region and instance types")
    buckets: dict[int, list[float]] = defaultdict(list)
    for record in records:
        price = float(record["SpotPrice"]) / gpus_per_instance
        buckets[HourlyCurve.hour_index(record["Timestamp"])].append(price)
    means = [fmean(buckets[h]) if buckets.get(h) else None for h in range(HOURS_PER_WEEK)]
    first = next(h for h in range(HOURS_PER_WEEK) if means[h] is not None)
    # Spot prices hold until the next change: carry each price forward, around the week.
    last = means[first]
    for offset in range(HOURS_PER_WEEK):
        h = (first + offset) % HOURS_PER_WEEK
        if means[h] is None:
            means[h] = last
        last = means[h]
    mean = fmean(means)  # type: ignore[arg-type]
    return mean, HourlyCurve(tuple(m / mean for m in means))  # type: ignore[operator]


def feed_override(model: PriceModel, records: list[dict[str, Any]], region: str) -> dict[str, Any]:
    """An override table with spot $/GPU-hour per GPU type seen, and the curve averaged over them."""
    by_instance: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_instance[record["InstanceType"]].append(record)
    mapping = instance_map(model)
    gpus: dict[str, Any] = {}
    curves: list[HourlyCurve] = []
    for instance, rows in by_instance.items():
        if instance not in mapping:
            continue
        gpu, count = mapping[instance]
        mean, curve = hourly_profile(rows, count)
        gpus[gpu] = {"spot": {region: round(mean, 4)}}
        curves.append(curve)
    if not curves:
        raise CostError("no spot records for any instance type in the price table; check the instance types")
    multipliers = [fmean(c.prices[h] for c in curves) for h in range(HOURS_PER_WEEK)]
    rows = {day: [round(multipliers[d * 24 + h], 4) for h in range(24)] for d, day in enumerate(DAYS)}
    return {"gpus": gpus, "spot_hour_of_week": rows}


def model_with_ec2_feed(model: PriceModel, client: Any, region: str, days: int = 14) -> PriceModel:
    """The model with its spot prices and curve replaced by what EC2 reports for this region."""
    records = fetch_spot_history(client, sorted(instance_map(model)), days=days)
    return PriceModel(merge_tables(model.table, feed_override(model, records, region)))


def ec2_client(region: str) -> Any:
    """A boto3 EC2 client, or a clear error when AWS credentials are not configured."""
    import boto3

    session = boto3.Session(region_name=region)
    if session.get_credentials() is None:
        raise CostError("no AWS credentials configured; set AWS_PROFILE or AWS_ACCESS_KEY_ID, or drop --ec2-history")
    return session.client("ec2")
