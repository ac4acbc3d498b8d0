"""Stand-in for ROLL's ``Worker``: its cluster, rank, rank info and pipeline config."""

from dataclasses import dataclass

from roll.distributed.scheduler.decorator import register


@dataclass
class RankInfo:
    dp_rank: int = 0
    dp_size: int = 1
    tp_rank: int = 0
    pp_rank: int = 0
    pp_size: int = 1
    cp_rank: int = 0


class Worker:
    def __init__(self, cluster_name: str, rank: int, world_size: int, rank_info: RankInfo):
        self.cluster_name = cluster_name
        self.rank = rank
        self.world_size = world_size
        self.rank_info = rank_info
        self.pipeline_config = None

    @register()
    def initialize(self, pipeline_config):
        self.pipeline_config = pipeline_config

    def start_model_update(self, *args, **kwargs):
        return {"updated": True}
