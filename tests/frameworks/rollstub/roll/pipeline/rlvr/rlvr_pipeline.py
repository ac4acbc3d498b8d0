"""Stand-in for rlvr's ``RLVRPipeline``: the tracker (``BasePipeline``), then the pipeline's
tokenizer; ``val(global_step)`` gets the validation batch and pops its scores and tags off it
(``DataProto.pop``) to reduce them, as rlvr's does."""

from tokenizers import Tokenizer, decoders, models

from roll.distributed.scheduler.protocol import DataProto
from roll.pipeline.base_pipeline import BasePipeline

VOCAB = ["<pad>", "<eos>", *"abcdefghi"]


class CharTokenizer:
    """One character per token id, built locally (no download); ``batch_decode`` as a
    Hugging Face tokenizer's."""

    def __init__(self):
        self.core = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, "<pad>"))
        self.core.decoder = decoders.Fuse()

    def batch_decode(self, sequences, skip_special_tokens=False):
        return self.core.decode_batch(sequences, skip_special_tokens=skip_special_tokens)


class RLVRPipeline(BasePipeline):
    def __init__(self, pipeline_config, log_history=(), val_batch=None):
        super().__init__(pipeline_config, log_history)
        self.tokenizer = CharTokenizer()
        self.val_batch = val_batch  # the validation scheduler's answer: global_step -> DataProto

    def val(self, global_step):
        batch: DataProto = self.val_batch(global_step)
        epoch_batch = batch.pop(batch_keys=["scores"], non_tensor_batch_keys=["tag"])
        return {"val_correct/all/mean": float((epoch_batch.batch["scores"] == 1).double().mean())}
