"""The ROLL hook against real ROLL (a checkout of alibaba/ROLL named by ``ROLL_SRC``; skipped
without it). ROLL is on no package registry; ``scripts/roll-env.sh`` builds the environment
these tests need (torch CPU, Ray, the packages ROLL imports on CPU) and runs them:

    ROLL_SRC=/path/to/ROLL scripts/roll-env.sh

* ROLL's own ``loss_func`` of rlvr's and agentic's ``ActorWorker`` and of ``CriticWorker``, on
  CPU, for two data-parallel ranks holding 8 and 55 response tokens, with the DP-global counts
  in ``meta_info`` as ROLL's strategies set them: every ``loss_agg_mode``, sequence-level
  importance sampling, dynamic batching (ROLL's own micro-batch iterator, two optimizer steps)
  and the train/infer filters. The hook's merged values equal float64 truth over the pooled
  tokens; where ROLL is right, they equal ROLL's own (reduced as ROLL's ``train_step`` and
  driver reduce them); ROLL's loss is bit-identical with and without the hook; rlpulse's code
  reads no tensor and calls no collective while ROLL's loss functions run.
* The YAML block through ROLL's own ``init()`` (its ``ray.init``) and a ROLL ``Cluster`` of two
  CPU workers: ``create_tracker("rlpulse", ...)`` gives the tracker in the driver, the setup hook
  ran in both workers, and a worker call is a phase of each rank's producer.

The figures of a run are printed (``-s``) for docs/integrations.md.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROLL_SRC = os.environ.get("ROLL_SRC")
pytestmark = pytest.mark.skipif(
    not ROLL_SRC, reason="ROLL_SRC is not set: run scripts/roll-env.sh with a ROLL checkout"
)
if ROLL_SRC:
    sys.path.insert(0, ROLL_SRC)
    torch = pytest.importorskip("torch")
    pytest.importorskip(
        "roll.pipeline.rlvr.actor_worker",
        reason="ROLL's CPU dependencies are missing: scripts/roll-env.sh installs them",
    )

RIGHT = 12
"""The longest response; rows are ``PROMPT + RIGHT + 1`` wide (``sequence_length``)."""
PROMPT = 3
VOCAB = 13
RANKS = {0: [3, 5], 1: [12, 9, 11, 7, 0, 12, 4, 0]}
"""Response lengths per rank: 8 and 55 tokens."""
MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
RLPULSE = str(Path(__file__).resolve().parents[2] / "rlpulse")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, dict[str, Any]]] = []

    def log(self, data: dict[str, Any], step: int) -> None:
        self.calls.append((step, dict(data)))

    def phase(self, infix: str, *, step: int) -> Any:
        import contextlib

        self.calls.append((step, {"phase": infix}))
        return contextlib.nullcontext()


def config(**over: Any) -> SimpleNamespace:
    from roll.configs.base_config import TrainInferCorrectionConfig

    base = dict(
        exp_name="roll-real",
        track_with="rlpulse",
        tracker_kwargs={},
        resume_from_checkpoint=False,
        loss_agg_mode="token-mean",
        pg_clip=0.2,
        use_pg_clip_range=False,
        pg_clip_low=0.2,
        pg_clip_high=0.2,
        dual_clip_loss=False,
        importance_sampling="token",
        ratio_type="token",
        enable_old_logprobs_recompute=False,
        train_infer_correction=TrainInferCorrectionConfig(),
        use_kl_loss=True,
        kl_loss_coef=0.05,
        entropy_loss_coef=0.0,
        rl_loss_coef=1.0,
        difficulty_loss_weight=False,
        length_loss_weight=False,
        ppo_epochs=1,
        sequence_length=PROMPT + RIGHT + 1,
        value_clip=None,
    )
    base.update(over)
    return SimpleNamespace(**base)


def worker(cls: type, rank: int, cfg: SimpleNamespace, name: str = "actor_train") -> Any:
    """A ROLL worker object without Ray: what ``loss_func`` reads of it."""
    from roll.distributed.executor.worker import RankInfo
    from roll.distributed.strategy.strategy import InferenceStrategy

    w = object.__new__(cls)
    w.pipeline_config = cfg
    w.strategy = object.__new__(InferenceStrategy)
    w.rank_info = RankInfo(world_size=2, dp_size=2, rank=rank, dp_rank=rank)
    w.rank, w.world_size, w.cluster_name = rank, 2, name
    w._logprobs_cache = {}
    return w


def rank_batch(rank: int, seed: int, drop: bool = True) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed * 10 + rank)
    lengths = RANKS[rank]
    rows, width = len(lengths), PROMPT + RIGHT + 1
    response_mask = torch.zeros(rows, width, dtype=torch.long)
    for i, n in enumerate(lengths):
        response_mask[i, PROMPT : PROMPT + n] = 1
    mask = response_mask[:, 1:]
    final = mask.clone()
    if drop and rank == 1:
        final[0] = 0  # ROLL's sample filter dropped a sample
    logits = torch.randn(rows, width, VOCAB, generator=g, dtype=torch.float64)
    ids = torch.randint(0, VOCAB, (rows, width), generator=g)
    labels = ids[:, 1:] * mask
    now = torch.log_softmax(logits[:, :-1], -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    noise = lambda s: torch.randn(rows, width - 1, generator=g, dtype=torch.float64) * s  # noqa: E731
    old = (now + noise(0.25)) * mask
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(rows, width, dtype=torch.long),
        "response_mask": response_mask,
        "final_response_mask": final,
        "old_log_probs": old,
        "infer_logprobs": (old + noise(0.2)) * mask,
        "ref_log_probs": (now + noise(0.2)) * mask,
        "advantages": torch.randn(rows, 1, generator=g, dtype=torch.float64).expand(-1, width - 1)
        * mask,
        "values": noise(1.0) * mask,
        "returns": noise(1.0) * mask,
        "logits": logits,
        "values_out": torch.randn(rows, width, 1, generator=g, dtype=torch.float64),
    }


def global_counts(batches: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``batch_num_tokens``, ``global_valid_samples`` as ROLL's strategy all-reduces them."""
    tokens, samples = {}, {}
    for key in ("response_mask", "final_response_mask"):
        masks = [b[key][:, 1:] if key == "response_mask" else b[key] for b in batches]
        tokens[key] = sum(m.sum() for m in masks)
        samples[key] = sum((m.sum(-1) > 0).sum() for m in masks)
    return tokens, samples


def proto(b: dict[str, Any], rows: slice, meta: dict[str, Any]) -> Any:
    from roll.distributed.scheduler.protocol import DataProto

    tensors = {k: v[rows] for k, v in b.items() if k not in ("logits", "values_out")}
    return DataProto.from_dict(tensors=tensors, meta_info=dict(meta))


def micro_batches(
    size: int, dynamic: bool, seed: int, drop: bool
) -> list[list[tuple[Any, Any, Any]]]:
    """Per rank, per optimizer step, its micro-batches: (DataProto, logits, values_out).
    Static: ``size`` sequences each. Dynamic: ROLL's own iterator narrows each micro-batch to
    its longest sequence, two micro-batches per optimizer step (``ga_steps``)."""
    from roll.utils.dynamic_batching import make_micro_batch_iter_for_dynamic_batching

    batches = {r: rank_batch(r, seed, drop) for r in RANKS}
    steps: list[list[tuple[int, slice]]] = []  # optimizer steps of (rank, rows)
    if not dynamic:
        steps.append(
            [(r, slice(i, i + size)) for r in RANKS for i in range(0, len(RANKS[r]), size)]
        )
    else:
        steps += [
            [(0, slice(0, 1)), (1, slice(0, 2)), (1, slice(2, 4))],
            [(0, slice(1, 2)), (1, slice(4, 6)), (1, slice(6, 8))],
        ]
    out: list[list[tuple[Any, Any, Any]]] = []
    for step in steps:
        tokens, samples = global_counts(
            [{k: v[rows] for k, v in batches[r].items()} for r, rows in step]
        )
        meta = {"global_step": 7, "batch_num_tokens": tokens, "global_valid_samples": samples}
        mbs = []
        for r, rows in step:
            b = batches[r]
            if dynamic:  # narrowed by ROLL to the micro-batch's own longest row
                longest = (
                    int(b["response_mask"][rows].nonzero()[:, 1].max().item()) + 2
                    if b["response_mask"][rows].any()
                    else PROMPT + 2
                )
                mini = proto(b, rows, meta)
                mini.meta_info["micro_batch_indices"] = [[0, rows.stop - rows.start]]
                mini.meta_info["micro_batch_lengths"] = [longest]
                (mb,) = make_micro_batch_iter_for_dynamic_batching(mini)
                mb.meta_info = dict(meta)
                mbs.append(
                    (r, mb, b["logits"][rows][:, :longest], b["values_out"][rows][:, :longest])
                )
            else:
                mbs.append((r, proto(b, rows, meta), b["logits"][rows], b["values_out"][rows]))
        out.append(mbs)
    return out


def hooked(kind: str) -> Any:
    """The hooked loss function of ``kind`` and ROLL's own."""
    from rlpulse.producer.integrations import roll_worker as W

    cls = roll_class(kind)
    original = vars(cls)["loss_func"]
    original = getattr(original, W._HOOKED, original)
    return W._loss(original, kind), original


def roll_class(kind: str) -> type:
    if kind == "rlvr":
        from roll.pipeline.rlvr.actor_worker import ActorWorker
    elif kind == "agentic":
        from roll.pipeline.agentic.agentic_actor_worker import ActorWorker
    else:
        from roll.pipeline.base_worker import CriticWorker as ActorWorker
    return ActorWorker


class Reads:
    """Tensor reads and collectives made from rlpulse's own code while active."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[str] = []
        for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
            monkeypatch.setattr(torch.Tensor, name, self._spy(getattr(torch.Tensor, name), name))
        import torch.distributed as dist

        for name in ("all_reduce", "all_gather", "broadcast", "reduce"):
            monkeypatch.setattr(dist, name, self._spy(getattr(dist, name), name))

    def _spy(self, original: Any, name: str) -> Any:
        def spy(*args: Any, **kwargs: Any) -> Any:
            caller = traceback.extract_stack(limit=2)[0].filename
            if caller.startswith(RLPULSE) and "producer/client" not in caller:
                self.seen.append(f"{name} from {caller}")
            return original(*args, **kwargs)

        return spy


def run_kind(
    kind: str,
    cfg: SimpleNamespace,
    dynamic: bool = False,
    size: int = 2,
    seed: int = 1,
    monkeypatch: pytest.MonkeyPatch | None = None,
    drop: bool = True,
) -> dict[str, Any]:
    """Every micro-batch of both ranks through ROLL's loss_func with and without the hook:
    the hook's states, ROLL's per-rank metric lists, the micro-batches."""
    from rlpulse.producer.integrations import roll_worker as W

    wrapped, original = hooked(kind)
    recorders = {r: Recorder() for r in RANKS}
    workers = {
        r: worker(roll_class(kind), r, cfg, "critic" if kind == "critic" else "actor_train")
        for r in RANKS
    }
    per_rank: dict[int, list[dict[str, Any]]] = {r: [] for r in RANKS}
    steps = micro_batches(size, dynamic, seed, drop)
    reads = Reads(monkeypatch) if monkeypatch is not None else None
    for step in steps:
        for r, mb, logits, values_out in step:
            out_tensor = values_out if kind == "critic" else logits
            a = out_tensor.clone().requires_grad_(True)
            b = out_tensor.clone().requires_grad_(True)
            plain_loss, plain_metrics = original(workers[r], mb, a)
            W._PRODUCERS.clear()
            W._PRODUCERS[(workers[r].cluster_name, "roll-real", r, 2)] = recorders[r]  # type: ignore[assignment]
            loss, metrics = wrapped(workers[r], mb, b)
            assert torch.equal(loss, plain_loss) and loss.dtype == plain_loss.dtype
            assert metrics == plain_metrics
            loss.backward()
            plain_loss.backward()
            assert torch.equal(a.grad, b.grad)
            per_rank[r].append(metrics)
    W._PRODUCERS.clear()
    states: dict[str, list[Any]] = {}
    for rec in recorders.values():
        for _, data in rec.calls:
            for name, state in data.items():
                states.setdefault(name, []).append(state)
    return {"states": states, "per_rank": per_rank, "steps": steps, "reads": reads}


def merged(states: list[Any]) -> float:
    from rlpulse.producer.values import Fraction

    if isinstance(states[0], Fraction):
        return float(
            sum(float(s.numerator) for s in states) / sum(float(s.denominator) for s in states)
        )
    w = sum(float(s.weight) for s in states)
    return sum(float(s.value) * float(s.weight) for s in states) / w


def roll_value(per_rank: dict[int, list[dict[str, Any]]], name: str, backward_steps: int) -> float:
    """ROLL's reported value: each rank's ``@sum`` list summed and divided by its static
    backward-step count (``ActorWorker.train_step``), the ranks' values concatenated
    (``DataProto.concat``) and reduced by tag (``reduce_metrics``)."""
    from roll.utils.functionals import flatten_sum, reduce_metrics

    values: list[Any] = []
    for metrics in per_rank.values():
        series = [m[name] for m in metrics if name in m]
        if name.endswith("@sum"):
            total = flatten_sum(series)
            values.append(total / backward_steps if backward_steps > 0 else total)
        else:
            values.extend(series)
    (reduced,) = reduce_metrics({name: values}).values()
    return float(reduced)


def truth(run: dict[str, Any], cfg: SimpleNamespace, kind: str) -> dict[str, float]:
    """float64 truth over the pooled loss tokens of every micro-batch, with loops, the masks as
    ROLL's own filter function (``compute_train_infer_correction``) leaves them."""
    from roll.utils.functionals import log_probs_from_logits
    from roll.utils.train_infer_corrections import compute_train_infer_correction

    tok: dict[str, list[float]] = {}
    seq: dict[str, list[float]] = {}
    clip = cfg.pg_clip
    for step in run["steps"]:
        for _, mb, logits, _ in step:
            data = mb.batch
            mask = data["response_mask"][:, 1:].long()
            width = mask.shape[1]
            labels = data["input_ids"][:, 1:] * mask
            # the log-probabilities as ROLL computes them (in float32), everything after in float64
            logp = log_probs_from_logits(logits[:, :-1], labels).double() * mask
            old, infer = data["old_log_probs"], data["infer_logprobs"]
            weight, filt, _ = compute_train_infer_correction(
                cfg.train_infer_correction, mask, old, infer, 1, 1
            )
            loss_mask = (mask if kind == "agentic" else data["final_response_mask"]) * filt.long()
            for i in range(mask.shape[0]):
                cols = [t for t in range(width) if loss_mask[i, t]]
                if not cols:
                    continue
                lr = [float(logp[i, t] - old[i, t]) for t in cols]
                seq_lr = sum(lr) / len(lr)
                ratios = [
                    pow(2.718281828459045, seq_lr)
                    if cfg.importance_sampling == "seq"
                    else pow(2.718281828459045, x)
                    for x in lr
                ]
                pgs, kls, clips = [], [], []
                for t, r in zip(cols, ratios, strict=True):
                    a = float(data["advantages"][i, t])
                    pg = -min(r * a, min(max(r, 1 - clip), 1 + clip) * a)
                    if cfg.train_infer_correction.is_weight.enabled:
                        pg *= float(weight[i, t])
                    pgs.append(pg)
                    d = float(data["ref_log_probs"][i, t] - logp[i, t])
                    kls.append(min(max(pow(2.718281828459045, d) - d - 1, -10), 10))
                    clips.append(1.0 if r < 1 - clip or r > 1 + clip else 0.0)
                for name, series in (("pg", pgs), ("kl", kls), ("clip", clips), ("ratio", ratios)):
                    tok.setdefault(name, []).extend(series)
                    n = {
                        "seq-mean-token-sum": 1,
                        "seq-mean-token-mean": len(series),
                        "seq-mean-token-sum-norm": cfg.sequence_length - 1,
                    }.get(cfg.loss_agg_mode, 1)
                    seq.setdefault(name, []).append(sum(series) / n)
                    seq.setdefault(name + "_mean", []).append(sum(series) / len(series))
    by_mode = (
        (lambda k: sum(tok[k]) / len(tok[k]))
        if cfg.loss_agg_mode == "token-mean"
        else (lambda k: sum(seq[k]) / len(seq[k]))
    )
    return {
        "actor/pg_loss": by_mode("pg"),
        "actor/kl_loss": by_mode("kl"),
        "actor/ppo_ratio_clipfrac": sum(tok["clip"]) / len(tok["clip"]),
        "actor/ratio_mean": sum(seq["ratio_mean"]) / len(seq["ratio_mean"]),
    }


FIGURES: list[str] = []


def report(line: str) -> None:
    FIGURES.append(line)
    print(line)


@pytest.mark.parametrize("mode", MODES)
def test_rlvr_actor_exact_in_every_mode_and_bit_identical(mode: str, monkeypatch) -> None:
    cfg = config(loss_agg_mode=mode)
    run = run_kind("rlvr", cfg, monkeypatch=monkeypatch)
    assert run["reads"].seen == []
    want = truth(run, cfg, "rlvr")
    for name, value in want.items():
        assert merged(run["states"][name]) == pytest.approx(value, rel=1e-9), name
    roll = {n: roll_value(run["per_rank"], f"{n}@sum", 1) for n in want}
    report(
        f"rlvr {mode}, a sample dropped by ROLL's sample filter: "
        + ", ".join(f"{n}: ROLL {roll[n]:.6g} exact {want[n]:.6g}" for n in want)
    )
    # ROLL's ratio mean is over every response token, the dropped sample's too
    assert roll["actor/ratio_mean"] != pytest.approx(want["actor/ratio_mean"], rel=1e-6)
    if mode == "token-mean":  # bug (c): the dropped sample's tokens are in ROLL's sum
        assert roll["actor/pg_loss"] != pytest.approx(want["actor/pg_loss"], rel=1e-6)
    if mode == "seq-mean-token-sum-norm":  # grows with the number of sequences
        assert roll["actor/pg_loss"] != pytest.approx(want["actor/pg_loss"], rel=1e-3)


@pytest.mark.parametrize("mode", MODES[:3])
def test_where_roll_is_right_the_values_are_rolls(mode: str) -> None:
    """Static batching, token importance sampling, no sample dropped: ROLL's own reduction is
    exact, and the hook's merged values equal it."""
    cfg = config(loss_agg_mode=mode)
    run = run_kind("rlvr", cfg, drop=False)
    want = truth(run, cfg, "rlvr")
    for name, value in want.items():
        got = merged(run["states"][name])
        assert got == pytest.approx(value, rel=1e-9), name
        # ROLL computes in float32: equal within its rounding
        assert got == pytest.approx(roll_value(run["per_rank"], f"{name}@sum", 1), rel=1e-6), name


def test_sequence_importance_sampling_clip_fraction() -> None:
    cfg = config(importance_sampling="seq", pg_clip=0.05)
    run = run_kind("rlvr", cfg)
    want = truth(run, cfg, "rlvr")
    got = merged(run["states"]["actor/ppo_ratio_clipfrac"])
    rolls = roll_value(run["per_rank"], "actor/ppo_ratio_clipfrac@sum", 1)
    report(f"GSPO ppo_ratio_clipfrac: ROLL {rolls:.4f} exact {got:.4f}")
    assert got == pytest.approx(want["actor/ppo_ratio_clipfrac"], rel=1e-9)
    assert merged(run["states"]["actor/pg_loss"]) == pytest.approx(want["actor/pg_loss"], rel=1e-9)


def test_dynamic_batching() -> None:
    cfg = config(loss_agg_mode="token-mean")
    run = run_kind("rlvr", cfg, dynamic=True)
    want = truth(run, cfg, "rlvr")
    # two optimizer steps, where ROLL's train_step divides by its static count (one here:
    # 8 rows // (per_device 2 x GA 4)) and its token-mean is per optimizer step
    roll = roll_value(run["per_rank"], "actor/pg_loss@sum", 1)
    got = merged(run["states"]["actor/pg_loss"])
    report(f"dynamic batching pg_loss: ROLL {roll:.6g} exact {got:.6g}")
    assert got == pytest.approx(want["actor/pg_loss"], rel=1e-9)
    assert merged(run["states"]["actor/ratio_mean"]) == pytest.approx(
        want["actor/ratio_mean"], rel=1e-9
    )
    assert abs(roll - got) > 1e-3


def test_train_infer_filters() -> None:
    from roll.configs.base_config import (
        TrainInferCorrectionConfig,
        TrainInferFilterConfig,
        TrainInferISWeightConfig,
    )

    corr = TrainInferCorrectionConfig(
        is_weight=TrainInferISWeightConfig(enabled=True, upper_bound=1.2),
        filters=[
            TrainInferFilterConfig(enabled=True, agg_type="token", ratio_low=0.8, ratio_high=1.25),
            TrainInferFilterConfig(
                enabled=True,
                agg_type="geometric",
                ratio_enabled=False,
                diff_enabled=True,
                diff_low=-0.05,
                diff_high=0.05,
            ),
        ],
    )
    cfg = config(loss_agg_mode="seq-mean-token-mean", train_infer_correction=corr)
    run = run_kind("rlvr", cfg)
    want = truth(run, cfg, "rlvr")
    for name in ("actor/pg_loss", "actor/kl_loss", "actor/ppo_ratio_clipfrac"):
        assert merged(run["states"][name]) == pytest.approx(want[name], rel=1e-9), name
    rate = merged(run["states"]["actor/train_infer_token_ratio_mask_mean"])
    final = merged(run["states"]["actor/train_infer_final_mask_mean"])
    roll_rate = roll_value(run["per_rank"], "actor/train_infer_token_ratio_mask_mean@sum", 1)
    roll_final = roll_value(run["per_rank"], "actor/train_infer_final_mask_mean", 1)
    report(
        f"filters: token ratio pass rate ROLL {roll_rate:.4f} exact {rate:.4f}; "
        f"final_mask_mean ROLL {roll_final:.4f} exact {final:.4f}"
    )
    assert 0 < rate <= 1 and 0 < final <= 1 and roll_rate > 1


def test_agentic_actor_and_critic() -> None:
    cfg = config(loss_agg_mode="token-mean")
    run = run_kind("agentic", cfg)
    want = truth(run, cfg, "agentic")
    assert merged(run["states"]["actor/pg_loss"]) == pytest.approx(want["actor/pg_loss"], rel=1e-9)
    critic = run_kind("critic", cfg)
    errors, losses = [], []
    for step in critic["steps"]:
        for _, mb, _, values_out in step:
            mask = mb.batch["response_mask"][:, 1:]
            v = values_out[:, :-1, 0]
            for i in range(mask.shape[0]):
                cols = [t for t in range(mask.shape[1]) if mask[i, t]]
                if cols:
                    e = [float((v[i, t] - mb.batch["returns"][i, t]) ** 2) for t in cols]
                    errors.append(sum(e) / len(e))
                    losses.append(0.5 * sum(e) / len(e))
    got = merged(critic["states"]["critic/loss"])
    roll_loss = roll_value(critic["per_rank"], "critic/loss", 1)
    roll_clip = roll_value(critic["per_rank"], "critic/clipfrac", 1)
    report(
        f"critic/loss ROLL {roll_loss:.4f} exact {got:.4f}; critic/clipfrac ROLL {roll_clip:.4f} exact 0"
    )
    assert got == pytest.approx(sum(losses) / len(losses), rel=1e-9)
    assert merged(critic["states"]["critic/clipfrac"]) == 0.0
    assert roll_clip == pytest.approx(2 * roll_loss)


def test_the_yaml_block_through_rolls_ray_init_and_a_cluster(tmp_path: Path, monkeypatch) -> None:
    import ray

    from tests.frameworks import roll_real_cluster as job

    # ROLL's init() starts a Ray head with the `ray` CLI (`ray start --head`), which outlives
    # this process: its own temp dir, and its processes (found by that dir) stopped after.
    ray_dir = tempfile.mkdtemp(prefix="rl47-", dir="/tmp")
    monkeypatch.setenv("RAY_RUNTIME_ENV_HOOK", "rlpulse.producer.integrations.roll.ray_hook")
    monkeypatch.setenv("RAY_TMPDIR", ray_dir)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, ROLL_SRC or ""]))
    monkeypatch.setenv(
        "PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    )
    monkeypatch.chdir(tmp_path)
    try:
        result = job.run(tmp_path)
    finally:
        ray.shutdown()
        stop_processes_under(ray_dir)
    assert result["tracker"] == "RlpulseTracker"
    assert result["setup_ran"] == [True, True]
    assert result["phases"] == [[0, "test_cluster/add"], [1, "test_cluster/add"]]
    report(
        f"YAML block: {result['tracker']} in the driver; setup hook ran in workers "
        f"{result['setup_ran']}; phases by rank {result['phases']}"
    )


def stop_processes_under(directory: str) -> None:
    """SIGTERM, then SIGKILL, the processes whose command line names ``directory`` (the Ray
    head this test's ROLL started), by PID."""
    import signal
    import time

    def pids() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if directory.encode() in (entry / "cmdline").read_bytes():
                        found.append(int(entry.name))
                except OSError:
                    pass
        return found

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids():
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        time.sleep(2)


class _Handle:
    """A Ray actor handle's ``method.remote(...)``, answered through Ray's object store: what
    rlvr's and agentic's ``val`` ask their validation schedulers for."""

    def __init__(self, **answers: Any) -> None:
        self.answers = answers

    def __getattr__(self, method: str) -> Any:
        import ray

        answer = self.answers[method]
        return SimpleNamespace(remote=lambda *args, **kwargs: ray.put(answer))


def check_samples(state: dict[str, Any], rows: list[dict[str, Any]], k: int) -> None:
    """A recorded samples state against every row of its batch (``roll_real_batches``)."""
    assert (state["rows"], state["dropped"], state["cut"], state["key"]) == (
        len(rows),
        0,
        0,
        "score",
    )
    for part in ("top", "bottom", "random"):
        assert len(state[part]) == min(k, len(rows))
        for got in state[part]:
            assert (got.pop("role"), got.pop("rank")) == ("driver", 0)
            assert any(got == pytest.approx(row) for row in rows), (got, rows)
    scores = sorted(r["score"] for r in rows)
    assert [r["score"] for r in state["top"]] == scores[::-1][:k]
    assert [r["score"] for r in state["bottom"]] == scores[:k]


def test_generations_from_rolls_own_functions_reach_the_collector(tmp_path: Path) -> None:
    """ROLL's batches, built by ROLL's own functions (``roll_real_batches``), through ROLL's own
    hook points in the driver: ``MetricsManager.add_all_metrics`` (rlvr's trained batch),
    ``RLVRPipeline.val`` (its validation batch from the scheduler through Ray's object store,
    read as ``val`` pops its scores), agentic's ``compute_train_data_metrics`` and
    ``AgenticPipeline.val``; the tracker from ROLL's ``create_tracker`` with a real
    ``RLVRConfig``. The collector's jsonl holds every batch's rows as the batch has them, the
    texts decoded with a tokenizer built locally, and the run's config."""
    import ray
    import roll.pipeline.agentic.agentic_pipeline as agentic_pipeline
    from roll.pipeline.agentic.agentic_pipeline import AgenticPipeline
    from roll.pipeline.rlvr.rlvr_pipeline import RLVRPipeline
    from roll.utils.metrics.metrics_manager import MetricsManager
    from roll.utils.tracking import create_tracker

    from rlpulse.producer.integrations import roll as rlpulse_roll
    from rlpulse.trainer.tokenizer import build_tokenizer
    from tests.frameworks import roll_real_batches as B
    from tests.frameworks.helpers import jsonl_collector, records

    k = 2
    tok = build_tokenizer()
    config = B.rlvr_config()
    rlpulse_roll.register()
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=tempfile.mkdtemp(prefix="rl47s-", dir="/tmp"),
        log_to_driver=False,
    )
    try:
        for function in (MetricsManager.add_all_metrics, RLVRPipeline.val, RLVRPipeline.__init__):
            assert getattr(function, "_rlpulse_samples_of", False), function
        with jsonl_collector(tmp_path) as (collector, out):
            kwargs = {
                "address": collector.address,
                "run": "roll-real-samples",
                "config_dir": None,
                "producer": {"samples_k": k, "close_timeout_s": 10.0},
            }
            tracker = create_tracker("rlpulse", config=config.to_dict(), **kwargs)
            # what the hooked RLVRPipeline.__init__ does once the pipeline has its tokenizer
            tracker.samples.tokenizer = tok
            rlpulse_roll.SAMPLES.current = tracker.samples
            batches: dict[tuple[str, int], tuple[Any, str]] = {}

            batch = B.trained(tok, config, step=0)  # step 0: rlvr trains and validates
            val_batch = B.generated(tok, seed=50)
            batches[("rollout/samples", 0)] = (batch, "rlvr")
            batches[("val/samples", 0)] = (val_batch, "rlvr")
            pipeline = object.__new__(RLVRPipeline)
            config.validation = SimpleNamespace(generating_args=config.actor_infer.generating_args)
            pipeline.pipeline_config = config
            pipeline.val_dataset = list(range(len(val_batch)))
            pipeline.val_generate_scheduler = _Handle(get_batch=val_batch)
            val_metrics = pipeline.val(global_step=0)
            manager = MetricsManager()
            manager.add_all_metrics(0, batch)
            tracker.log({**manager.get_metrics(), **val_metrics}, step=0)

            agentic = B.agentic(tok, step=1)  # step 1: agentic trains and validates
            agentic_val = B.agentic(tok, step=51)
            batches[("rollout/samples", 1)] = (agentic, "agentic")
            batches[("val/samples", 1)] = (agentic_val, "agentic")
            apipe = object.__new__(AgenticPipeline)
            apipe.pipeline_config = SimpleNamespace(
                val_batch_size=len(agentic_val), rollout_dump_dir=None
            )
            apipe.val_dataset_manager = _Handle(reset=None)
            apipe.val_rollout_scheduler = _Handle(get_batch=agentic_val)
            metrics = apipe.val(1, {})
            metrics.update(agentic_pipeline.compute_train_data_metrics(batch=agentic))
            tracker.log(metrics, step=1)
            tracker.finish()
            stats = tracker.stats()
        recs = records(out)
    finally:
        ray.shutdown()
        rlpulse_roll.unregister()
    assert stats["samples_failed"] == 0, stats
    assert (stats["samples_logged"], stats["val_samples_logged"]) == (2, 2)
    for (name, step), (batch, kind) in batches.items():
        check_samples(recs[step]["samples"][name], B.expected_rows(batch, tok, kind), k)
    rollout = recs[0]["samples"]["rollout/samples"]["top"][0]
    assert rollout["prompt"] in B.PROMPTS and rollout["response"].endswith(tok.eos_token)
    assert recs[0]["config"]["exp_name"] == "roll-real-samples" and "config" not in recs[1]
    report(
        f"samples: rlvr {len(batches[('rollout/samples', 0)][0])} trained rows, "
        f"{len(batches[('val/samples', 0)][0])} validation rows; agentic "
        f"{len(agentic)} and {len(agentic_val)}; config of {len(recs[0]['config'])} keys"
    )
