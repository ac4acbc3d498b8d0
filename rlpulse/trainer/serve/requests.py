"""``POST /generate`` bodies: parsing, limits, and the error every bad one gets.

A request is ``{"prompt": str, "max_new_tokens": int, "temperature": number}``; only the
prompt is required. Every problem is a :class:`RequestError` carrying one of the catalog's
error kinds (``rlpulse.schemas.serving.ERROR_KINDS``), the field at fault and a message that says what
is wrong and what would be accepted; :func:`error_body` is what the client receives.

>>> limits = Limits(max_new_tokens=64, max_temperature=10.0, default_max_new_tokens=16,
...                 default_temperature=1.0)
>>> parse_request(b'{"prompt": "abc>", "temperature": 0}', limits)
GenerateRequest(prompt='abc>', max_new_tokens=16, temperature=0.0)
>>> try:
...     parse_request(b'{"prompt": "abc>", "max_new_tokens": "8"}', limits)
... except RequestError as exc:
...     print(exc.kind, "-", exc)
wrong_type - max_new_tokens must be an integer, got a string ('8')
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from rlpulse.schemas import serving as S

FIELDS = ("prompt", "max_new_tokens", "temperature")
"""The fields of a request body."""
EXAMPLE = '{"prompt": "abc>", "max_new_tokens": 8, "temperature": 0}'
"""A valid body, quoted by the errors about a body's shape."""

STATUS: dict[str, int] = {
    S.INVALID_JSON: 400,
    S.BODY_TOO_LARGE: 413,
    S.UNKNOWN_FIELD: 422,
    S.MISSING_FIELD: 422,
    S.WRONG_TYPE: 422,
    S.EMPTY_PROMPT: 422,
    S.PROMPT_TOO_LONG: 422,
    S.OUT_OF_RANGE: 422,
    S.OVERLOADED: 503,
    S.INTERNAL: 500,
}
"""HTTP status of each error kind: the client's fault is 4xx, the server's 5xx."""


class RequestError(Exception):
    """A request the server will not (or cannot) answer; ``kind`` is the catalog's error kind.

    >>> RequestError("empty_prompt", "prompt is empty", field="prompt").status
    422
    """

    def __init__(self, kind: str, message: str, *, field: str | None = None) -> None:
        if kind not in STATUS:
            raise ValueError(f"unknown error kind {kind!r}: expected one of {', '.join(STATUS)}")
        super().__init__(message)
        self.kind = kind
        self.field = field
        self.status = STATUS[kind]


def error_body(exc: RequestError) -> dict[str, Any]:
    """The JSON a failed request receives: the kind, the field at fault and the message."""
    return {"error": exc.kind, "field": exc.field, "message": str(exc)}


@dataclass(frozen=True)
class Limits:
    """What a request may ask for, and what it gets when it does not say."""

    max_new_tokens: int
    max_temperature: float
    default_max_new_tokens: int
    default_temperature: float


@dataclass(frozen=True)
class GenerateRequest:
    """A valid request, defaults filled in (the prompt is not tokenized yet)."""

    prompt: str
    max_new_tokens: int
    temperature: float


def parse_request(body: bytes, limits: Limits) -> GenerateRequest:
    """The request in ``body``, or RequestError naming the first problem found."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(
            S.INVALID_JSON, f"the body is not valid JSON ({exc}); send an object such as {EXAMPLE}"
        ) from None
    except RecursionError:
        raise RequestError(
            S.INVALID_JSON,
            "the body nests arrays or objects too deeply to parse; a request is one flat "
            f"object such as {EXAMPLE}",
        ) from None
    except ValueError as exc:  # an integer of more digits than Python converts (4300)
        raise RequestError(
            S.INVALID_JSON, f"the body holds a number too long to parse ({exc})"
        ) from None
    if not isinstance(data, dict):
        raise RequestError(
            S.INVALID_JSON, f"the body must be a JSON object, got {_json_type(data)}"
        )
    for key in data:
        if _lone_surrogate(key) is not None:
            raise RequestError(
                S.INVALID_JSON,
                f"the field name {_short(key)} holds a lone UTF-16 surrogate, which is not a "
                f"Unicode character; the fields are {', '.join(FIELDS)}",
            )
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise RequestError(
            S.UNKNOWN_FIELD,
            f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"the fields are {', '.join(FIELDS)}",
            field=unknown[0],
        )
    if "prompt" not in data:
        raise RequestError(S.MISSING_FIELD, "prompt is required", field="prompt")
    prompt = data["prompt"]
    if not isinstance(prompt, str):
        raise RequestError(
            S.WRONG_TYPE,
            f"prompt must be a string, got {_json_type(prompt)} ({_short(prompt)})",
            field="prompt",
        )
    if not prompt:
        raise RequestError(S.EMPTY_PROMPT, "prompt is empty", field="prompt")
    at = _lone_surrogate(prompt)
    if at is not None:
        raise RequestError(
            S.INVALID_JSON,
            f"prompt holds a lone UTF-16 surrogate ({prompt[at]!r} at character {at}), which "
            "is not a Unicode character: send the text as UTF-8, with a character outside "
            "the Basic Multilingual Plane escaped as a surrogate pair",
            field="prompt",
        )
    max_new_tokens = data.get("max_new_tokens", limits.default_max_new_tokens)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise RequestError(
            S.WRONG_TYPE,
            f"max_new_tokens must be an integer, got {_json_type(max_new_tokens)} "
            f"({_short(max_new_tokens)})",
            field="max_new_tokens",
        )
    if not 1 <= max_new_tokens <= limits.max_new_tokens:
        raise RequestError(
            S.OUT_OF_RANGE,
            f"max_new_tokens must be from 1 to {limits.max_new_tokens}, got "
            f"{_short(max_new_tokens)}",
            field="max_new_tokens",
        )
    temperature = data.get("temperature", limits.default_temperature)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise RequestError(
            S.WRONG_TYPE,
            f"temperature must be a number, got {_json_type(temperature)} ({_short(temperature)})",
            field="temperature",
        )
    # An integer is compared as one: one too large for a float must not overflow here.
    finite = isinstance(temperature, int) or math.isfinite(temperature)
    if not (finite and 0 <= temperature <= limits.max_temperature):
        raise RequestError(
            S.OUT_OF_RANGE,
            f"temperature must be from 0 (greedy) to {limits.max_temperature:g}, got "
            f"{_short(temperature)}",
            field="temperature",
        )
    return GenerateRequest(prompt, max_new_tokens, float(temperature))


def _lone_surrogate(text: str) -> int | None:
    """Where ``text`` holds a UTF-16 surrogate that is no character (JSON's ``"\\ud800"``
    decodes to one); None when it is all Unicode characters."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _json_type(value: Any) -> str:
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}
    names.update({list: "an array", dict: "an object", type(None): "null"})
    return names.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
