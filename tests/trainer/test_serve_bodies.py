"""Request bodies that used to escape ``parse_request`` as something other than a
RequestError (and so became a 500 ``internal``): each is now the client's error, named
(issue 22, item 14). The real server is exercised in tests/integration/test_serve_hardening.py.
"""

from __future__ import annotations

import json

import pytest

from rlpulse.schemas import serving as S
from rlpulse.trainer.serve.requests import Limits, RequestError, error_body, parse_request

LIMITS = Limits(
    max_new_tokens=63, max_temperature=10.0, default_max_new_tokens=16, default_temperature=1.0
)


@pytest.mark.parametrize(
    ("body", "kind", "field", "says"),
    [
        (b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", S.INVALID_JSON, None, "deeply"),
        (b'{"a": ' * 20_000 + b"1" + b"}" * 20_000, S.INVALID_JSON, None, "deeply"),
        (b'{"prompt": "x\\ud83d"}', S.INVALID_JSON, "prompt", "'\\ud83d' at character 1"),
        (b'{"\\ud800prompt": "x"}', S.INVALID_JSON, None, "field name '\\ud800prompt'"),
        (
            b'{"prompt": "x", "max_new_tokens": ' + b"9" * 4301 + b"}",
            S.INVALID_JSON,
            None,
            "digits",
        ),
        (
            b'{"prompt": "x", "temperature": 1' + b"0" * 309 + b"}",
            S.OUT_OF_RANGE,
            "temperature",
            "got 1000",
        ),
        (
            b'{"prompt": "x", "temperature": -' + b"9" * 400 + b"}",
            S.OUT_OF_RANGE,
            "temperature",
            "got -999",
        ),
    ],
)
def test_bad_bodies_are_request_errors_with_a_sendable_message(
    body: bytes, kind: str, field: str | None, says: str
) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request(body, LIMITS)
    assert (caught.value.kind, caught.value.field) == (kind, field)
    assert says in str(caught.value)
    # the answer must encode as UTF-8 JSON (a lone surrogate in it could not be sent)
    json.dumps(error_body(caught.value), ensure_ascii=False).encode("utf-8")
    assert len(str(caught.value)) < 400


def test_a_surrogate_pair_is_a_character_and_large_integers_in_range_still_work() -> None:
    got = parse_request(b'{"prompt": "ab\\ud83d\\ude00>", "temperature": 10}', LIMITS)
    assert got.prompt == "ab\U0001f600>" and got.temperature == 10.0
