"""Stand-in for rlvr's ``ActorWorker.loss_func``: a token-mean clipped policy loss over the
global token count, with ROLL's ``@sum`` metrics (micro-batch sum over the global count)."""

import torch

from roll.pipeline.base_worker import ActorWorker as BaseActorWorker


class ActorWorker(BaseActorWorker):
    def loss_func(self, data, output_tensor):
        mask = data.batch["response_mask"][:, 1:].long()
        final = data.batch.get("final_response_mask", mask)
        global_tokens = data.meta_info["batch_num_tokens"]["response_mask"]
        log_probs = self.strategy.op_compute_log_probs(
            logits=output_tensor,
            input_ids=data.batch["input_ids"],
            attention_mask=data.batch["response_mask"],
        )
        old = self.get_old_log_probs_with_cache(data, log_probs)
        ratio = (log_probs - old).exp()
        clip = self.pipeline_config.pg_clip
        adv = data.batch["advantages"]
        loss_mat = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv) * final
        loss = loss_mat.sum() / global_tokens
        clipped = ((ratio < 1 - clip) | (ratio > 1 + clip)).double() * final
        return loss, {
            "actor/pg_loss@sum": float(loss),
            "actor/ppo_ratio_clipfrac@sum": float(clipped.sum() / global_tokens),
            "actor/ratio_mean@sum": float((ratio * final).sum() / final.sum().clamp(min=1)),
        }
