"""What PromQL expressions in deploy/ refer to: metric names and ``__name__`` regexes.

Not a PromQL parser: it strips what cannot be a metric name (label matchers, strings, ranges,
``by``/``on``/... label lists, numbers and durations) and keeps the identifiers that are not
function calls or keywords. ``promtool check rules`` separately proves every expression parses.

>>> refs = references('sum by (run) (rate(a_total{job="x"}[5m])) > on (run) group_left b offset 5m')
>>> sorted(refs.names), refs.regexes
(['a_total', 'b'], [])
>>> references('label_replace({__name__=~"m_(.+)_bytes", run=~"$run"}, "p", "$1", "__name__", "m_(.+)")').regexes
['m_(.+)_bytes']
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "atan2", "inf", "nan",
}  # fmt: skip
_STRING = r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`'
_BRACES = re.compile(r"\{((?:" + _STRING + r"|[^{}\"'`])*)\}")
_MATCHER = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(" + _STRING + r")\s*,?")
_STRINGS = re.compile(_STRING)
_BRACKETS = re.compile(r"\[[^\]]*\]")
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", re.I)
_NUMBERS = re.compile(
    r"(?<![A-Za-z0-9_:])(0x[0-9a-fA-F]+|\d+(\.\d*)?([eE][+-]?\d+)?([smhdwy]|ms)*)"
)
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", re.S)


@dataclass
class References:
    names: set[str] = field(default_factory=set)
    regexes: list[str] = field(default_factory=list)  # __name__=~ patterns


def _unquote(s: str) -> str:
    return json.loads(s) if s.startswith('"') else s[1:-1]


def references(expr: str) -> References:
    refs = References()

    def matchers(m: re.Match[str]) -> str:
        for label, op, value in _MATCHER.findall(m.group(1)):
            if label == "__name__":
                if op == "=":
                    refs.names.add(_unquote(value))
                elif op == "=~":
                    refs.regexes.append(_unquote(value))
                else:
                    raise ValueError(f"negative __name__ matcher in {expr!r}: cannot check it")
        return " "

    text = _BRACES.sub(matchers, expr)
    text = _STRINGS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    text = _NUMBERS.sub(" ", text)
    for m in _IDENT.finditer(text):
        word = m.group(0)
        if word.lower() in KEYWORDS or re.match(r"\s*\(", text[m.end() :]):
            continue
        refs.names.add(word)
    return refs


@dataclass(frozen=True)
class Query:
    where: str  # file and rule or panel, for the failure message
    expr: str


def rule_queries(path: Path) -> Iterator[Query]:
    for group in yaml.safe_load(path.read_text())["groups"]:
        for rule in group["rules"]:
            what = rule.get("alert") or rule.get("record")
            yield Query(f"{path.name}: {what}", rule["expr"])


def dashboard_queries(path: Path) -> Iterator[Query]:
    board = json.loads(path.read_text())

    def panels(items: list[dict]) -> Iterator[dict]:
        for p in items:
            yield p
            yield from panels(p.get("panels", []))  # collapsed rows

    for p in panels(board.get("panels", [])):
        for t in p.get("targets", []):
            yield Query(f"{path.name}: {p['title']} {t.get('refId')}", t["expr"])
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = _LABEL_VALUES.match(q)
            yield Query(f"{path.name}: variable {var['name']}", m.group(1) if m else q)


def grafana_to_promql(expr: str) -> str:
    """Grafana's variables replaced by values Prometheus accepts (for a syntax check)."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)
