"""ROLL's batches as ROLL's driver holds them, built by ROLL's own functions on CPU, for
``test_roll_real.py``'s samples test (needs a checkout of ROLL on the path): the engine's output
turned into a batch by ``postprocess_generate`` (prompts left-padded by a tokenizer built
locally, responses of random digits and an end-of-sequence token), the verifier's ``scores``,
then, for a trained rlvr batch, ROLL's own ``get_sample_level_mask``, ``reward_postprocess``,
``compute_token_reward`` and ``compute_advantage`` (GRPO), as ``RLVRPipeline.run`` calls them;
agentic's fields (episode scores, trajectory ids, tags) as its rollout scheduler gives them.
:func:`expected_rows` is every row as the driver should log it, written row by row here."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

PROMPTS = ["1+1=", "12+7=", "3*4=", "100-1=", "7*7="]
N = 2
"""Responses per prompt."""
SEQUENCE_LENGTH = 24


def rlvr_config() -> Any:
    """A real ``RLVRConfig``: GRPO, ``N`` responses per prompt, short sequences."""
    from roll.configs.generating_args import GeneratingArguments
    from roll.configs.worker_config import WorkerConfig
    from roll.pipeline.rlvr.rlvr_config import RLVRConfig

    return RLVRConfig(
        exp_name="roll-real-samples",
        actor_infer=WorkerConfig(generating_args=GeneratingArguments(num_return_sequences=N)),
        rewards={},
        sequence_length=SEQUENCE_LENGTH,
        num_return_sequences_in_group=N,
        adv_estimator="grpo",
    )


def generated(tokenizer: Any, seed: int, prompts: list[str] = PROMPTS) -> Any:
    """``N`` responses to each prompt, as ``postprocess_generate`` makes the engine's output a
    batch, with the verifier's 0/1 ``scores`` and the rows' domain and tag."""
    from roll.distributed.scheduler.protocol import DataProto
    from roll.utils.functionals import postprocess_generate

    g = torch.Generator().manual_seed(seed)
    enc = tokenizer(prompts, padding=True, return_tensors="pt")
    attention = enc["attention_mask"]
    position = torch.clip(torch.cumsum(attention, -1) - 1, min=0)
    asked = DataProto.from_single_dict(
        {"input_ids": enc["input_ids"], "attention_mask": attention, "position_ids": position}
    )
    responses = []
    for _ in range(len(prompts) * N):
        digits = torch.randint(0, 10, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g)
        text = "".join(str(int(d)) for d in digits)
        responses.append(
            [*tokenizer(text, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
        )
    width = max(len(r) for r in responses)
    tail = torch.full((len(responses), width), tokenizer.pad_token_id)
    for i, ids in enumerate(responses):
        tail[i, : len(ids)] = torch.tensor(ids)
    output = torch.cat([enc["input_ids"].repeat_interleave(N, 0), tail], -1)
    batch = postprocess_generate(
        asked, output, N, SEQUENCE_LENGTH, tokenizer.eos_token_id, tokenizer.pad_token_id
    )
    rows = len(batch)
    batch.batch["scores"] = torch.randint(0, 2, (rows,), generator=g).float()
    batch.non_tensor_batch["domain"] = np.array(["math"] * rows, dtype=object)
    batch.non_tensor_batch["tag"] = np.array(
        ["gsm8k" if i % 3 else "math500" for i in range(rows)], dtype=object
    )
    return batch


def trained(tokenizer: Any, config: Any, step: int) -> Any:
    """A trained rlvr batch at ``step``: its log-probabilities, then ROLL's sample mask, reward
    post-processing, token rewards and GRPO advantages."""
    from roll.utils.functionals import (
        RunningMoments,
        compute_advantage,
        compute_token_reward,
        get_sample_level_mask,
        reward_postprocess,
    )
    from roll.utils.kl_controller import get_kl_controller

    batch = generated(tokenizer, seed=step)
    g = torch.Generator().manual_seed(100 + step)
    rows, width = batch.batch["input_ids"].shape
    mask = batch.batch["response_mask"][:, 1:].float()
    batch.batch["response_level_rewards"] = batch.batch["scores"].clone()
    batch.batch["old_log_probs"] = -torch.rand(rows, width - 1, generator=g) * mask
    batch.batch["ref_log_probs"] = -torch.rand(rows, width - 1, generator=g) * mask
    batch.batch["infer_logprobs"] = -torch.rand(rows, width - 1, generator=g) * mask
    batch.meta_info["global_step"] = step
    batch, _ = get_sample_level_mask(batch, config)
    batch, _ = reward_postprocess(batch, config, RunningMoments())
    kl = get_kl_controller(
        init_kl_coef=config.init_kl_coef, target_kl=config.target_kl, kl_horizon=config.kl_horizon
    )
    batch, _ = compute_token_reward(batch, config, kl)
    return compute_advantage(
        data=batch,
        gamma=config.gamma,
        lambd=config.lambd,
        adv_estimator=config.adv_estimator,
        advantage_clip=config.advantage_clip,
        whiten_advantages=config.whiten_advantages,
        whiten_rewards=config.whiten_rewards,
        response_mask=batch.batch["final_response_mask"].clone(),
        pipeline_config=config,
    )


def agentic(tokenizer: Any, step: int) -> Any:
    """An agentic batch: one row per trajectory, its episode score, trajectory and group ids
    and tags (what agentic's rollout scheduler gives), token rewards and advantages."""
    batch = generated(tokenizer, seed=200 + step)
    g = torch.Generator().manual_seed(300 + step)
    rows, width = batch.batch["input_ids"].shape
    mask = batch.batch["response_mask"][:, 1:].float()
    batch.batch["token_level_rewards"] = torch.randn(rows, width - 1, generator=g) * mask
    batch.batch["advantages"] = torch.randn(rows, width - 1, generator=g) * mask
    batch.batch["returns"] = batch.batch["advantages"].clone()
    objects = batch.non_tensor_batch
    objects["episode_scores"] = np.array(
        [float(s) for s in torch.rand(rows, generator=g)], dtype=object
    )
    objects["traj_id"] = np.array([f"traj-{step}-{i}" for i in range(rows)], dtype=object)
    objects["traj_group_id"] = np.array([f"group-{i // N}" for i in range(rows)], dtype=object)
    objects["tags"] = np.array(
        ["sokoban" if i % 2 else "frozen_lake" for i in range(rows)], dtype=object
    )
    batch.meta_info["global_step"] = step
    return batch


def expected_rows(batch: Any, tokenizer: Any, kind: str) -> list[dict[str, Any]]:
    """Every row of ``batch`` as the driver should log it (``kind`` ``rlvr`` or ``agentic``),
    computed row by row: texts with the tokenizer's ``decode``, numbers in float64."""
    t, objects = batch.batch, batch.non_tensor_batch
    out = []
    for i in range(len(batch)):
        ids, prompt = t["input_ids"][i], t["prompt_mask"][i].bool()
        response = t["attention_mask"][i].bool() & ~prompt
        tokens = t["response_mask"][i, 1:].bool()
        n = int(tokens.sum())
        row: dict[str, Any] = {
            "prompt": tokenizer.decode(ids[prompt].tolist(), skip_special_tokens=False),
            "response": tokenizer.decode(ids[response].tolist(), skip_special_tokens=False),
            "response_length": n,
            "prompt_length": int(prompt.sum()),
        }
        if kind == "agentic":
            row["score"] = float(objects["episode_scores"][i])
            row["tag"], row["traj_id"] = str(objects["tags"][i]), str(objects["traj_id"][i])
        else:
            row["score"] = float(t["scores"][i])
            row["tag"] = str(objects["tag"][i])
            if "domain" in objects:
                row["domain"] = str(objects["domain"][i])
        if "token_level_rewards" in t:
            row["reward"] = float(t["token_level_rewards"][i].double().sum())
            adv = t["advantages"][i].double()[tokens]
            row["advantage"] = float(adv.sum() / n) if n else None
        if "final_response_mask" in t:
            row["trained"] = bool(t["final_response_mask"][i].bool().any())
        if "infer_logprobs" in t:
            diff = (t["infer_logprobs"][i].double() - t["old_log_probs"][i].double()).abs()[tokens]
            row["logprob_mismatch"] = float(diff.sum() / n) if n else None
        out.append(row)
    return out
