"""How the tracker sinks render a step's samples: the table, markdown cells, captioned texts,
the one-line best and worst, and the guard that keeps a failing samples write from raising."""

from __future__ import annotations

import logging

import pytest

from rlpulse.collector.sinks import samples_view as view
from rlpulse.schemas.samples import SampleLimits, reduce_rows
from tests.collector.sinks.conftest import make_samples


def test_table_holds_every_kept_row_by_set_with_its_origin_and_fields() -> None:
    state = make_samples()["rollout/samples"]
    t = view.table(state)
    assert t.columns[:3] == ("set", "role", "rank")
    assert set(t.columns[3:]) == {
        "prompt",
        "response",
        "reward",
        "advantage",
        "response_length",
        "note",
    }
    assert [r[0] for r in t.rows] == ["top"] * 2 + ["bottom"] * 2 + ["random"] * 2
    col = t.columns.index
    rewards = [r[col("reward")] for r in t.rows]
    assert rewards[:4] == [3.0, 2.0, 0.0, 1.0]  # best first, then worst first
    assert [(r[1], r[2]) for r in t.rows[:2]] == [("actor_train", 1), ("actor_train", 1)]
    by_reward = {r[col("reward")]: r for r in t.rows}
    assert by_reward[0.0][col("note")] == "naïve — ünïcode"
    assert by_reward[1.0][col("note")] is None  # a row without the field: an empty cell
    assert sorted(rewards[4:]) == sorted({r.fields["reward"] for r in state.random})


def test_a_users_own_role_and_rank_fields_keep_their_names() -> None:
    state = reduce_rows([{"role": "judge", "rank": 3, "score": 1.0}], "score", origin=("val", 2))
    t = view.table(state)
    assert t.columns == ("set", "origin_role", "origin_rank", "role", "rank", "score")
    assert t.rows[0] == ("top", "val", 2, "judge", 3, 1.0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a | b", "a \\| b"),
        ("line1\nline2\r\nline3", "line1<br>line2<br>line3"),
        ("back\\slash", "back\\\\slash"),
        ("<think>a & b</think>", "&lt;think&gt;a &amp; b&lt;/think&gt;"),
        (None, ""),
        (0.25, "0.25"),
        (3.0, "3"),
        (True, "True"),
    ],
)
def test_markdown_cells_escape_pipes_and_line_breaks(value: object, expected: str) -> None:
    assert view.cell(value) == expected  # type: ignore[arg-type]


def test_long_cells_are_cut_and_say_how_much() -> None:
    out = view.cell("y" * 2500, limit=1000)
    assert out == "y" * 1000 + "…[+1500]"


def test_markdown_is_a_table_of_one_line_per_row() -> None:
    state = make_samples()["rollout/samples"]
    md = view.markdown("rollout/samples", state)
    head, blank, columns, rule, *rows = md.split("\n")
    assert "4 rows" in head and "`reward`" in head and "1 bad rows dropped" in head
    assert "1 texts cut" in head
    assert blank == ""
    width = columns.count(" | ") + 1
    assert rule == "|" + "---|" * width
    assert len(rows) == 6
    for row in rows:  # a cell's own | is escaped, so every row splits into the columns
        assert row.replace("\\|", "").count(" | ") + 1 == width
    assert "answer \\| 4<br>because" in md
    assert max(len(r) for r in rows) < 3000  # the 4096-byte response shown to 1000 characters


def test_captioned_texts_one_per_row() -> None:
    state = make_samples()["rollout/samples"]
    texts = view.captioned(state)
    assert len(texts) == 6
    caption, body = texts[0]
    assert caption == "top 1 · actor_train/1 · reward=3"
    assert body.splitlines()[0] == "prompt: Q3: 2+3?"
    assert "reward: 3" in body.splitlines()


def test_one_line_names_best_and_worst_with_a_short_cut_of_the_response() -> None:
    state = make_samples()["rollout/samples"]
    line = view.one_line("rollout/samples", state, limit=20)
    assert "\n" not in line
    assert line.startswith("rollout/samples  4 rows  best reward=3 actor_train/1 ")
    assert '"' + "x" * 20 + "…[+" in line  # the best response, cut
    assert 'worst reward=0 actor_train/0 "answer | 2 because"' in line
    assert line.endswith("(1 dropped)")


def test_main_text_field_prefers_response_then_any_text_but_the_prompt() -> None:
    def field(rows: list[dict]) -> str | None:
        return view.main_field(reduce_rows(rows, "r", origin=("a", 0), limits=SampleLimits(k=1)))

    assert field([{"prompt": "p", "completion": "c", "r": 1}]) == "completion"
    assert field([{"prompt": "p", "thought": "t", "r": 1}]) == "thought"
    assert field([{"prompt": "p", "r": 1}]) == "prompt"
    assert field([{"r": 1}]) is None


def test_sample_writer_counts_and_logs_a_failure_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    samples = make_samples()
    seen = []

    def write(name: str, state: object) -> None:
        seen.append(name)
        if name == "rollout/samples":
            raise RuntimeError("tracker refused")

    writer = view.SampleWriter("demo")
    with caplog.at_level(logging.WARNING, logger="rlpulse.collector.sinks.samples_view"):
        assert writer.each(samples, write) == 1
        assert writer.each(samples, write) == 1
    assert seen == ["rollout/samples", "val/samples"] * 2
    assert writer.failed == 2
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "tracker refused" in warned[0]  # rate-limited
