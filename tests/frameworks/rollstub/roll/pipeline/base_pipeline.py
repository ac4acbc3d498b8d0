"""Stand-in for ROLL's ``BasePipeline``: one tracker from ``track_with`` and
``tracker_kwargs``; on resume, the whole ``log_history`` re-logged under its old steps."""

from roll.utils.tracking import create_tracker


class BasePipeline:
    def __init__(self, pipeline_config, log_history=()):
        self.pipeline_config = pipeline_config
        self.tracker = create_tracker(
            tracker_name=pipeline_config.track_with,
            config=pipeline_config.to_dict(),
            **pipeline_config.tracker_kwargs,
        )
        if pipeline_config.resume_from_checkpoint:
            for metrics in log_history:
                self.tracker.log(values=metrics, step=metrics["system/step"])
