"""Which registered endpoints ``/sd`` lists (issue 22, item 15): without CurveZMQ any process
that reaches the collector can register a URL for Prometheus to fetch, so link-local and
cloud metadata addresses are refused by default, in every spelling a resolver reads, and
``sd_targets.allow`` restricts the listed hosts to the ones an operator names."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.health import Health
from rlpulse.collector.output.discovery import Discovery, ScrapeTarget, TargetPolicy
from rlpulse.schemas.errors import ConfigError


def target(url: str, rank: int = 0) -> ScrapeTarget:
    return ScrapeTarget(url, "r", "rollout", rank, "node-1")


def listed(discovery: Discovery, *urls: str) -> list[str]:
    discovery.publish(target(u, i) for i, u in enumerate(urls))
    return [t.url for t in discovery.targets()]


METADATA = [
    "http://169.254.169.254/latest/meta-data",
    "http://169.254.169.254:80/computeMetadata/v1",
    "http://169.254.169.254./latest",  # trailing dot
    "http://2852039166/latest",  # the same address as one decimal number
    "http://0xa9fea9fe/latest",  # ... in hexadecimal
    "http://0251.0376.0251.0376/latest",  # ... in octal parts
    "http://169.254.43518/latest",  # ... with a 16-bit last part
    "http://[::ffff:169.254.169.254]/latest",  # ... mapped into IPv6
    "http://[fe80::1]:9100/metrics",  # IPv6 link-local
    "http://[fd00:ec2::254]/latest",  # AWS over IPv6
    "http://100.100.100.200/latest",  # Alibaba Cloud
    "http://metadata.google.internal/computeMetadata/v1",
    "http://METADATA.Google.Internal./computeMetadata/v1",
    "http://metadata.goog/computeMetadata/v1",
]
ORDINARY = [
    "http://10.0.0.7:8000/metrics",
    "http://127.0.0.1:9100/metrics",
    "https://[fd00::7]:9443",
    "http://gpu-node-7:8000/metrics",
    "http://vllm-0.vllm.train.svc.cluster.local:8000/metrics",
]


@pytest.mark.parametrize("url", METADATA)
def test_metadata_and_link_local_endpoints_are_not_listed_by_default(url: str) -> None:
    assert listed(Discovery(), url, ORDINARY[0]) == [ORDINARY[0]]


def test_ordinary_endpoints_are_listed_by_default() -> None:
    assert sorted(listed(Discovery(), *ORDINARY)) == sorted(ORDINARY)


def test_an_allow_list_admits_only_the_networks_and_names_it_gives() -> None:
    policy = TargetPolicy.from_mapping(
        {"allow": ["10.0.0.0/8", "fd00::/8", "*.svc.cluster.local", "GPU-Node-7"]}
    )
    assert sorted(listed(Discovery(policy), *ORDINARY)) == sorted(
        u for u in ORDINARY if "127.0.0.1" not in u
    )
    assert policy.refusal("http://127.0.0.1:9100/metrics") == "127.0.0.1 is not in sd_targets.allow"
    assert policy.refusal("http://cluster.local/metrics") is not None  # *.x is below x only
    assert policy.refusal("http://gpu-node-70/metrics") is not None  # names match whole
    assert policy.refusal("http://167772161/metrics") is None  # 10.0.0.1, as a number
    # deny still wins: an allowed network does not admit a metadata address inside it
    wide = TargetPolicy.from_mapping({"allow": ["0.0.0.0/0"]})
    assert wide.refusal(METADATA[0]) == "169.254.169.254 is in sd_targets.deny (169.254.0.0/16)"


def test_the_default_deny_can_be_replaced() -> None:
    lifted = TargetPolicy.from_mapping({"deny": []})
    assert all(lifted.refusal(u) is None for u in METADATA)
    own = TargetPolicy.from_mapping({"deny": ["10.0.0.0/8", "*.internal"]})
    assert own.refusal("http://10.9.9.9/metrics") is not None
    assert own.refusal("http://db.internal/metrics") is not None
    assert own.refusal(METADATA[0]) is None  # replaced, not extended


def test_refusals_are_counted_once_per_registration_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health = Health()
    assert health.snapshot()["scrape_targets_refused"] == 0  # exported from start-up
    discovery = Discovery(TargetPolicy(), health)
    bad, good = target(METADATA[0], 0), target(ORDINARY[0], 1)
    with caplog.at_level(logging.WARNING, logger="rlpulse.collector"):
        for _ in range(3):  # the daemon republishes every half second
            discovery.publish([bad, good])
    assert discovery.targets() == (good,)
    assert health.snapshot()["scrape_targets_refused"] == 1
    assert [r.getMessage() for r in caplog.records] == [
        "service discovery: not listing http://169.254.169.254/latest/meta-data (run r, role "
        "rollout, rank 0, host node-1): 169.254.169.254 is in sd_targets.deny (169.254.0.0/16)"
    ]
    discovery.publish([good])  # it left
    discovery.publish([bad, good])  # and registered again
    assert health.scrape_targets_refused == 2


@pytest.mark.parametrize(
    ("sd_targets", "field", "problem"),
    [
        ([], "sd_targets", "must be a mapping"),
        ({"alow": ["10.0.0.0/8"]}, "sd_targets.alow", "unknown key"),
        ({"allow": "10.0.0.0/8"}, "sd_targets.allow", "must be a list"),
        ({"allow": ["10.0.0.1/8"]}, "sd_targets.allow[0]", "has host bits set"),
        ({"allow": ["10.0.0.0/8", "300.1.1.1/32"]}, "sd_targets.allow[1]", "not a network"),
        ({"deny": ["not a host!"]}, "sd_targets.deny[0]", "must be a network"),
        ({"deny": [""]}, "sd_targets.deny[0]", "must be a network"),
        ({"deny": [7]}, "sd_targets.deny[0]", "must be a network"),
    ],
)
def test_a_bad_sd_targets_names_the_entry(sd_targets: object, field: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        CollectorConfig.from_mapping({"sd_targets": sd_targets})
    assert caught.value.field == field
    assert problem in str(caught.value)


def test_sd_targets_round_trips_through_the_yaml_form() -> None:
    config = CollectorConfig.from_mapping({"sd_targets": {"allow": ["10.0.0.0/8"], "deny": []}})
    again = CollectorConfig.from_mapping(config.to_mapping())
    assert again == config
    assert again.target_policy == TargetPolicy.from_mapping({"allow": ["10.0.0.0/8"], "deny": []})
    assert CollectorConfig().target_policy == TargetPolicy()


def test_the_readme_example_is_a_valid_sd_targets() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "operating.md").read_text()
    (block,) = re.findall(r"```yaml\n(sd_targets:.*?)```", readme, re.S)
    config = CollectorConfig.from_mapping(yaml.safe_load(block))
    assert config.target_policy.refusal("http://10.0.0.7:8000/metrics") is None
    assert config.target_policy.refusal("http://192.168.1.5:8000/metrics") is not None
