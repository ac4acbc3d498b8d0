"""Stand-in for ROLL's ``MetricsManager``: the driver's metrics of a step, among them
``add_all_metrics(global_step, batch, ...)`` over the whole trained batch (rlvr's ``token/``
lengths and ``critic/`` scores)."""


class MetricsManager:
    def __init__(self):
        self.metrics = {}

    def add_all_metrics(
        self,
        global_step,
        batch,
        n_sample=-1,
        resource_manager=None,
        actor_infer=None,
        actor_train=None,
    ):
        lengths = batch.batch["response_mask"][:, 1:].sum(-1).double()
        self.metrics["token/response_length/mean"] = float(lengths.mean())
        self.metrics["critic/score/mean"] = float(batch.batch["scores"].double().mean())

    def get_metrics(self):
        return dict(self.metrics)
