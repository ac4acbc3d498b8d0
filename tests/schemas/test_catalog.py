"""The catalog defines every name in ROLL's metric reference, and resolves names correctly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlpulse.schemas import CATALOG, Reduction, Stat, metrics as M
from rlpulse.schemas.topology import PHASES

HERE = Path(__file__).parent
SEEDS = HERE.parents[1].parent / "shared" / "seeds"
REFERENCE_FILES = ("000_bf2cf0832c062ebd.txt", "002_15dc60a1fd9e83f1.txt")
NAME = re.compile(r"(?<![\w/{])((?:val|critic|actor|tokens|system|time|memory)/[A-Za-z0-9_{}/]+)")
CLUSTERS = ("actor_train", "critic", "reference", "actor_infer")


def reference_names() -> list[str]:
    lines = (HERE / "reference_names.txt").read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def expand(name: str) -> list[str]:
    """Concrete names for a reference template: every documented phase, a few clusters, device 0 and 3."""
    if "{" not in name:
        return [name]
    out = []
    for cluster in CLUSTERS:
        for phase in PHASES:
            for device in ("0", "3"):
                out.append(
                    name.replace("{metric_infix}", f"{cluster}/{phase}").replace(
                        "{device_id}", device
                    )
                )
    return out


def test_vendored_list_matches_the_seeds() -> None:
    if not SEEDS.is_dir():
        pytest.skip(f"{SEEDS} not present; the vendored list is checked below")
    found: set[str] = set()
    for name in REFERENCE_FILES:
        found |= {m.group(1).rstrip("/") for m in NAME.finditer((SEEDS / name).read_text())}
    assert found == set(reference_names())


def test_reference_list_is_complete_enough_to_mean_something() -> None:
    names = reference_names()
    assert len(names) >= 85
    assert "memory/{metric_infix}/end/onload/max_reserved_frac/{device_id}" in names


REPORTED = {out for entry in CATALOG.entries.values() for out in entry.output_names().values()}
"""Every name the fixed entries report when they are logged."""


@pytest.mark.parametrize("name", reference_names())
def test_every_reference_name_is_in_the_catalog(name: str) -> None:
    for concrete in expand(name):
        assert concrete in CATALOG, concrete
        # ... and is what an entry reports (not merely accepted as a stray output name),
        # or an instance of a template.
        assert concrete in REPORTED or any(t.match(concrete) for t in CATALOG.templates), concrete


def test_families_are_one_entry_with_three_outputs() -> None:
    r = CATALOG.resolve(M.CRITIC_RETURNS.name)  # (critic/advantages is a distribution)
    assert r.reduction is Reduction.MEAN
    assert r.outputs == {
        Stat.MEAN: "critic/returns/mean",
        Stat.MAX: "critic/returns/max",
        Stat.MIN: "critic/returns/min",
    }
    assert set(CATALOG.resolve(M.ACTOR_RATIO.name).outputs.values()) == {
        "actor/ratio_mean",
        "actor/ratio_max",
        "actor/ratio_min",
    }


def test_an_output_name_logged_alone_merges_by_its_statistic() -> None:
    assert CATALOG.resolve("critic/score/max").reduction is Reduction.MAX
    assert CATALOG.resolve("actor/sample_weights_min").reduction is Reduction.MIN
    assert CATALOG.resolve("val/score/mean").reduction is Reduction.MEAN


def test_reductions_are_declared_not_guessed_from_spelling() -> None:
    # verl's "max" in key rule would make these a max; they are means and fractions.
    assert CATALOG.resolve("actor/approxkl").reduction is Reduction.MEAN
    assert CATALOG.resolve(M.ACTOR_PPO_RATIO_CLIPFRAC.name).reduction is Reduction.FRACTION
    assert CATALOG.resolve("actor/valid_samples").reduction is Reduction.SUM
    assert CATALOG.resolve("actor/lr").reduction is Reduction.LAST
    assert CATALOG.resolve("time/actor_train/train_step/total").reduction is Reduction.MAX
    # A name outside the catalog: a weighted mean unless the producer declares otherwise,
    # whatever it is called.
    assert CATALOG.resolve("custom/minibatch_max_loss").reduction is Reduction.MEAN
    assert CATALOG.resolve("custom/peak", Reduction.MAX).reduction is Reduction.MAX
    # ... and a declaration cannot override the catalog.
    assert CATALOG.resolve("actor/pg_loss", Reduction.MAX).reduction is Reduction.MEAN


def test_template_units_and_validation() -> None:
    assert (
        CATALOG.resolve("memory/critic/train_step/end/onload/max_reserved_frac/0").unit == "ratio"
    )
    assert CATALOG.resolve("memory/critic/train_step/end/onload/reserved/0").unit == "GiB"
    assert "time/critic/train_step/bogus" not in CATALOG
    assert "memory/critic/train_step/middle/onload/reserved/0" not in CATALOG
    with pytest.raises(ValueError, match="does not fit"):
        M.TIME_PHASE.format(cluster="a/b", phase="train_step", part="total")


def test_every_entry_has_unit_and_help() -> None:
    for entry in CATALOG.entries.values():
        assert entry.unit and len(entry.help) > 10, entry.name
    for template in CATALOG.templates:
        assert template.unit and template.help


def test_derived_metrics_are_marked() -> None:
    for entry in (M.SYSTEM_TPS, M.SYSTEM_SAMPLES, M.SYSTEM_TOKENS):
        assert CATALOG.resolve(entry.name).derived
    assert CATALOG.resolve(M.SYSTEM_SAMPLES.name).cumulative


def test_near_miss_names_the_catalog_name_within_one_or_two_edits() -> None:
    """The rule of ``Catalog.near_miss``: a name outside the catalog within one edit (under
    10 characters) or two (from 10 on) of an entry's name or output name."""
    from rlpulse.schemas.catalog import _edits_within

    assert CATALOG.near_miss("actor/pg_los") == "actor/pg_loss"  # a letter dropped
    assert CATALOG.near_miss("actor/pg_lsos") == "actor/pg_loss"  # two swapped: two edits
    assert CATALOG.near_miss("critic/score/meen") == "critic/score/mean"  # an output name
    assert CATALOG.near_miss("actor/pg_loss") is None  # known: no miss
    assert CATALOG.near_miss("critic/score/mean") is None
    assert CATALOG.near_miss("actor/p_lo") is None  # three edits off
    assert CATALOG.near_miss("my/own_metric") is None
    assert _edits_within("kitten", "sitting", 3) == 3
    assert _edits_within("kitten", "sitting", 2) is None
    assert _edits_within("", "ab", 2) == 2
