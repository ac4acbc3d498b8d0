"""A producer's metrics URL: checked once, carried in the hello (and a relay's members) as
optional trailing fields, so producers and collectors of either side of the change still talk."""

from __future__ import annotations

import msgpack
import pytest

from rlpulse.schemas import SchemaError, protocol as P
from rlpulse.schemas.endpoint import DEFAULT_PATH, MAX_URL_LENGTH, MetricsUrl
from rlpulse.schemas.messages import Member


@pytest.mark.parametrize(
    ("url", "parts"),
    [
        ("http://10.0.0.5:8000/metrics", ("http", "10.0.0.5:8000", "/metrics")),
        ("https://vllm-0.ns.svc:8443/v1/metrics", ("https", "vllm-0.ns.svc:8443", "/v1/metrics")),
        ("http://[fd00::7]:9100", ("http", "[fd00::7]:9100", DEFAULT_PATH)),
        ("HTTP://node-7/metrics", ("http", "node-7", "/metrics")),
    ],
)
def test_good_urls_split_into_what_prometheus_scrapes(url: str, parts: tuple) -> None:
    parsed = MetricsUrl.parse(url)
    assert (parsed.scheme, parsed.address, parsed.path) == parts


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("", "1..1024 characters"),
        ("http://h/" + "m" * MAX_URL_LENGTH, "1..1024 characters"),
        (8000, "1..1024 characters"),
        ("ftp://h/metrics", "http:// or https://"),
        ("10.0.0.5:8000/metrics", "http:// or https://"),
        ("http://user:secret@h:8000/metrics", "credentials"),
        ("http://h:8000/metrics?x=1", "query or fragment"),
        ("http://h:8000/metrics#top", "query or fragment"),
        ("http://:8000/metrics", "name a host"),
        ("http://h:port/metrics", "name a host"),
        ("http://h:/metrics", "name a host"),
        ("http://h:0/metrics", "1 to 65535"),
        ("http://h:70000/metrics", "1 to 65535"),
        ("http://h/met rics", "no spaces"),
        ("http://h/métrics", "ASCII"),
    ],
)
def test_bad_urls_are_refused_saying_why(url: object, problem: str) -> None:
    with pytest.raises(SchemaError) as err:
        MetricsUrl.parse(url)
    assert err.value.reason == "bad_field"
    assert problem in err.value.detail


def hello(**kwargs: object) -> bytes:
    args = {"run": "r", "role": "rollout", "rank": 1, "world_size": 2, "host": "h", "pid": 9}
    return P.encode_hello(5, 0, **(args | kwargs))  # type: ignore[arg-type]


def test_the_hello_carries_the_url_and_whether_the_producer_logs() -> None:
    msg = P.decode(hello(metrics_url="http://h:8000/metrics", logs=False))
    assert isinstance(msg, P.Hello)
    assert (msg.metrics_url, msg.logs) == ("http://h:8000/metrics", False)
    plain = P.decode(hello())
    assert isinstance(plain, P.Hello) and (plain.metrics_url, plain.logs) == ("", True)


def test_a_hello_of_an_earlier_producer_has_no_url_and_logs() -> None:
    # Version 2 before the fields existed: tag, producer, seq, run, role, rank, ws, host, pid,
    # roles, tables.
    old = msgpack.packb([21, 5, 0, "r", "rollout", 0, 1, "h", 9, {}, []], use_bin_type=True)
    msg = P.decode(old)
    assert isinstance(msg, P.Hello) and (msg.metrics_url, msg.logs) == ("", True)


def test_the_decoder_refuses_a_bad_url_and_an_endpoint_only_hello_without_one() -> None:
    with pytest.raises(SchemaError) as err:
        P.decode(hello(metrics_url="http://user@h:8000/metrics"))
    assert err.value.reason == "bad_field" and "credentials" in err.value.detail
    with pytest.raises(SchemaError) as err:
        P.decode(hello(logs=False))
    assert err.value.reason == "bad_field" and "metrics URL" in err.value.detail


def test_a_relays_members_carry_the_url_and_are_checked_too() -> None:
    member = Member(7, "r", "rollout", 0, 1, "h", {}, False, "http://h:8000/metrics", False)
    msg = P.decode(P.encode(P.RelayHello(3, 1, "relay-host", 1, [], [member])))
    assert isinstance(msg, P.RelayHello) and msg.members == [member]
    bad = Member(7, "r", "rollout", 0, 1, "h", {}, False, "gopher://h/", False)
    with pytest.raises(SchemaError) as err:
        P.decode(P.encode(P.RelayHello(3, 1, "relay-host", 1, [], [bad])))
    assert err.value.reason == "bad_field"
    # A member announced before the fields existed.
    old = msgpack.packb([27, 3, 1, "relay-host", 1, [], [[7, "r", "a", 0, 1, "h", {}, False]]])
    msg = P.decode(old)
    assert isinstance(msg, P.RelayHello)
    assert (msg.members[0].metrics_url, msg.members[0].logs) == ("", True)
