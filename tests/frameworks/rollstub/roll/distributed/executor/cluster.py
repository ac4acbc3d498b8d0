"""Stand-in for ROLL's ``Cluster``: a named group of workers the driver calls. Its workers are
in-process objects behind handles with Ray's ``__ray_call__`` (``handle.__ray_call__.remote(fn,
*args)`` runs ``fn(worker, *args)``), which is all the hook asks of a Ray actor handle."""

from roll.distributed.executor.worker import RankInfo


class _Call:
    def __init__(self, worker):
        self.worker = worker

    def remote(self, fn, *args, **kwargs):
        return fn(self.worker, *args, **kwargs)


class Handle:
    def __init__(self, worker):
        self.worker = worker
        self.__ray_call__ = _Call(worker)


class Cluster:
    def __init__(self, name, worker_cls, world_size, rank_infos=None):
        self.cluster_name = name
        infos = rank_infos or [RankInfo(dp_rank=r, dp_size=world_size) for r in range(world_size)]
        self.local = [worker_cls(name, r, world_size, infos[r]) for r in range(world_size)]
        self.workers = [Handle(w) for w in self.local]

    def call(self, method, *args_per_rank):
        return [
            getattr(w, method)(*args) for w, args in zip(self.local, args_per_rank, strict=False)
        ]
