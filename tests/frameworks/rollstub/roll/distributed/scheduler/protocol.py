"""Stand-in for ROLL's ``DataProto``: tensors by name (``batch``), per-sample objects
(``non_tensor_batch``), ``meta_info``; sliced into micro-batches that share ``meta_info``."""


class Batch(dict):
    def slice(self, start, end):
        return Batch({k: v[start:end] for k, v in self.items()})


class DataProto:
    def __init__(self, batch=None, non_tensor_batch=None, meta_info=None):
        self.batch = Batch(batch or {})
        self.non_tensor_batch = dict(non_tensor_batch or {})
        self.meta_info = dict(meta_info or {})

    def __len__(self):
        return len(next(iter(self.batch.values()))) if self.batch else 0

    def slice(self, start, end):
        part = DataProto(meta_info=self.meta_info)
        part.batch = self.batch.slice(start, end)
        part.meta_info = self.meta_info  # shared, as ROLL's micro-batches see the step's
        return part
