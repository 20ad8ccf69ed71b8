"""The shipped price model, user overrides, and the EC2 spot price history feed on recorded responses."""

import json
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest
from botocore.stub import ANY, Stubber

from training_platform.cost import CostError, load_price_model
from training_platform.cost.ec2_feed import fetch_spot_history, model_with_ec2_feed
from training_platform.spec import GPU_TYPES

# Two pages of DescribeSpotPriceHistory (p5.48xlarge hourly, g5.xlarge every 3 h) written in the
# API's documented JSON shape (this machine has no AWS access); botocore's Stubber checks each page
# against the EC2 service model before the client returns it.
RECORDED = Path(__file__).parent / "recorded" / "ec2_describe_spot_price_history.json"


def test_shipped_model_prices_every_gpu_type_and_spot_is_cheaper():
    model = load_price_model()
    assert set(GPU_TYPES) <= set(model.gpu_types)
    for gpu in GPU_TYPES:
        assert 0 < model.base_price(gpu, True) < model.base_price(gpu, False)
    multipliers = model.spot_multipliers()
    assert len(multipliers) == 168 and sum(multipliers) / 168 == pytest.approx(1.0, abs=0.01)


def test_user_table_overrides_entries_and_keeps_the_rest(tmp_path, monkeypatch):
    override = tmp_path / "prices.yaml"
    override.write_text("gpus:\n  H100:\n    on_demand: {us-east-1: 2.5}\n  MI300X:\n"
                        "    instance: x\n    gpus_per_instance: 8\n    on_demand: {us-east-1: 3.0}\n"
                        "    spot: {us-east-1: 1.5}\n")
    monkeypatch.setenv("TP_PRICES", str(override))
    model = load_price_model()
    assert model.base_price("H100", False) == 2.5
    assert model.base_price("H100", True) == 3.8  # spot kept from the shipped table
    assert model.base_price("MI300X", True) == 1.5
    with pytest.raises(CostError, match="no price for region 'ap-south-1'"):
        model.base_price("H100", False, "ap-south-1")


def test_bad_user_curve_is_refused(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("spot_hour_of_week: {mon: [1.0]}\n")
    with pytest.raises(CostError, match="spot_hour_of_week.mon needs 24 values"):
        load_price_model(bad)


def _stubbed_client():
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    stubber = Stubber(client)
    for page in json.loads(RECORDED.read_text()):
        for record in page["SpotPriceHistory"]:
            record["Timestamp"] = datetime.fromisoformat(record["Timestamp"])
        if not page["NextToken"]:
            del page["NextToken"]
        stubber.add_response("describe_spot_price_history", page, {
            "InstanceTypes": ANY, "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY, "EndTime": ANY,
            **({"NextToken": "page-2-token"} if "NextToken" not in page else {}),
        })
    return client, stubber


def test_feed_reads_every_page_and_replaces_spot_prices_and_curve():
    client, stubber = _stubbed_client()
    model = load_price_model()
    with stubber:
        records = fetch_spot_history(client, ["p5.48xlarge", "g5.xlarge"], now=datetime(2026, 11, 16, tzinfo=UTC))
    assert len(records) == 224
    client, stubber = _stubbed_client()
    with stubber:
        fed = model_with_ec2_feed(model, client, "us-east-1")
        stubber.assert_no_pending_responses()
    # p5: 8 GPUs per instance; the recorded price is 30.4 * (1.25 peak | 0.9 off-peak) per instance.
    peak_share = 45 / 168
    expected = 30.4 / 8 * (1.25 * peak_share + 0.9 * (1 - peak_share))
    assert fed.base_price("H100", True) == pytest.approx(expected, rel=1e-3)
    assert fed.base_price("H100", False) == model.base_price("H100", False)  # on-demand untouched
    monday_peak = datetime(2026, 11, 23, 15, tzinfo=UTC)
    monday_night = datetime(2026, 11, 23, 3, tzinfo=UTC)
    ratio = fed.price_at("H100", True, monday_peak) / fed.price_at("H100", True, monday_night)
    assert ratio == pytest.approx(1.25 / 0.9, rel=1e-3)
