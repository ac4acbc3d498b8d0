"""Stand-in for ROLL's ``DataProto``: tensors by name (``batch``), per-sample objects
(``non_tensor_batch``), ``meta_info``; sliced into micro-batches that share ``meta_info``;
``pop`` takes keys out into a new one (as rlvr's ``val`` takes its scores and tags)."""


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

    def pop(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None):
        assert batch_keys is not None
        out = DataProto(meta_info={k: self.meta_info.pop(k) for k in meta_info_keys or ()})
        out.batch = Batch({k: self.batch.pop(k) for k in batch_keys})
        out.non_tensor_batch = {
            k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys or ()
        }
        return out
