"""Stand-in for ROLL's actor and critic workers: ``train_step`` runs ``loss_func`` once per
micro-batch with the data-parallel-global token and sequence counts in ``meta_info``, and keeps
each micro-batch's metrics (ROLL's ``@sum`` convention: the micro-batch's sum over the global
count), as ROLL's strategies do."""

import torch

from roll.distributed.executor.worker import Worker
from roll.distributed.scheduler.decorator import register


class Strategy:
    """Log-probabilities of the next token at response positions (0 elsewhere)."""

    def op_compute_log_probs(self, logits, input_ids, attention_mask):
        labels = input_ids[:, 1:].clone()
        labels[attention_mask[:, 1:] == 0] = 0
        logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
        picked = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return picked * attention_mask[:, 1:]


class ActorWorker(Worker):
    def __init__(self, *args):
        super().__init__(*args)
        self.strategy = Strategy()

    @register()
    def train_step(self, data, micro_batches, global_counts):
        data.meta_info["batch_num_tokens"] = {"response_mask": global_counts[0]}
        data.meta_info["global_valid_samples"] = {"response_mask": global_counts[1]}
        metrics = {}
        for start, end, logits in micro_batches:
            loss, values = self.loss_func(data.slice(start, end), logits)
            loss.backward() if loss.requires_grad else None
            for key, value in values.items():
                metrics.setdefault(key, []).append(value)
        return metrics

    def get_old_log_probs_with_cache(self, data, log_probs):
        return data.batch["old_log_probs"]

    def compute_sample_weights(self, data, response_mask):
        return torch.ones(response_mask.shape[0], dtype=torch.float64)


class CriticWorker(Worker):
    @register()
    def train_step(self, data, micro_batches):
        metrics = {}
        for start, end, output in micro_batches:
            _loss, values = self.loss_func(data.slice(start, end), output)
            for key, value in values.items():
                metrics.setdefault(key, []).append(value)
        return metrics

    def forward_func_values(self, data, output_tensor):
        values = output_tensor[:, :-1].squeeze(-1)
        return values, {"values": values}

    def loss_func(self, data, output_tensor):
        mask = data.batch["response_mask"][:, 1:].double()
        values, _ = self.forward_func_values(data=data, output_tensor=output_tensor)
        error = (values - data.batch["returns"]) ** 2
        per_seq = (error * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        loss = 0.5 * per_seq.mean()
        return loss, {"critic/loss": float(loss), "critic/clipfrac": float(2 * loss)}
