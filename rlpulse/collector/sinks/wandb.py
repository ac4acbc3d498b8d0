"""Weights & Biases sink: one W&B run per rlpulse run, one history row per training step.

A step's samples (``StepRecord.samples``) go into the same row as one ``wandb.Table`` per name,
under ``samples/<name>`` (columns ``set``, ``role``, ``rank``, then the row's fields:
``rlpulse.collector.sinks.samples_view``); W&B shows each table at its step. They are logged
after the numbers, so a table W&B refuses is logged and counted, and the numbers stay.

The run's configuration (``StepRecord.config``) is the W&B run's config: given to
``wandb.init`` when it comes with the run's first step, merged in with ``run.config.update``
when it comes later (a changed value replaces the earlier one).

kwargs follow ROLL's ``tracker_kwargs`` for wandb: ``project``, ``name``, ``notes``, ``tags``,
``api_key``, plus ``mode`` (``online``, ``offline``, ``disabled``), ``dir``, ``entity``,
``group``, ``job_type`` and ``base_url`` (a self-hosted W&B server). ``mode`` defaults to ``WANDB_MODE``, else online. Offline runs are
written under ``<dir>/wandb/offline-run-*`` for ``wandb sync`` to upload later.

The API key comes from ``api_key`` or, failing that, ``WANDB_API_KEY``; with neither, an online
run uses whatever ``wandb login`` stored. The key is handed to wandb in its ``Settings`` (never
written to ``~/.netrc``) and never appears in a log line or an error message.

>>> import tempfile
>>> sink = WandbSink.from_kwargs({"project": "p", "mode": "offline", "dir": tempfile.mkdtemp()},
...                              SinkContext())
>>> sink.mode
'offline'
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from rlpulse.collector.sinks import samples_view
from rlpulse.collector.sinks.base import Sink, SinkContext, reject_unknown
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.samples import SampleState

FIELD = "tracker_kwargs.wandb"
_STRINGS = ("project", "entity", "name", "notes", "group", "job_type")
_KEYS = (*_STRINGS, "tags", "mode", "dir", "api_key", "base_url")
_MODES = {"online": "online", "offline": "offline", "dryrun": "offline", "disabled": "disabled"}


class WandbSink(Sink):
    """Logs each step with ``run.log(metrics, step=step)``.

    The W&B run for an rlpulse run starts on its first step (its display name is ``name``, or
    the rlpulse run name) and finishes in ``close()``.

    >>> WandbSink.from_kwargs({"mode": "disabled"}, SinkContext()).name
    'wandb'
    """

    name = "wandb"
    PATHS: ClassVar[tuple[str, ...]] = ("dir",)
    ENV: ClassVar[Mapping[str, str]] = {"mode": "WANDB_MODE", "api_key": "WANDB_API_KEY"}

    def __init__(
        self,
        wandb: Any,
        *,
        mode: str,
        init_kwargs: Mapping[str, Any],
        api_key: str | None = None,
        directory: Path | None = None,
        base_url: str | None = None,
    ) -> None:
        self._wandb = wandb
        self._base_url = base_url
        self.mode = mode
        self._init_kwargs = dict(init_kwargs)
        self._api_key = api_key
        self._dir = directory
        self._runs: dict[str, Any] = {}
        self._started = False  # wandb.init was called: the wandb service may be running
        self._samples = samples_view.SampleWriter(self.name)

    def __repr__(self) -> str:  # spelled out so that the key can never leak through a repr
        return f"WandbSink(mode={self.mode!r}, project={self._init_kwargs.get('project')!r})"

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], ctx: SinkContext) -> WandbSink:
        """Validate ``tracker_kwargs`` for wandb; raise ConfigError naming the field."""
        reject_unknown(kwargs, _KEYS, FIELD)
        init_kwargs: dict[str, Any] = {}
        for key in _STRINGS:
            value = kwargs.get(key)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{FIELD}.{key}", "must be a string", value)
            if value:
                init_kwargs[key] = value
        tags = kwargs.get("tags")
        if tags is not None:
            if (
                isinstance(tags, str)
                or not isinstance(tags, Sequence)
                or not all(isinstance(t, str) for t in tags)
            ):
                raise ConfigError(f"{FIELD}.tags", "must be a list of strings", tags)
            init_kwargs["tags"] = list(tags)

        raw_mode = kwargs.get("mode")
        where = f"{FIELD}.mode"
        if raw_mode is None:
            default = ctx.defaults.get("mode")
            raw_mode, where = (default.value, default.source) if default else ("online", where)
        mode = _MODES.get(str(raw_mode).lower()) if isinstance(raw_mode, str) else None
        if mode is None:
            raise ConfigError(where, "must be one of online, offline, disabled", raw_mode)

        directory = kwargs.get("dir")
        if directory is not None:
            if not isinstance(directory, str | os.PathLike) or not str(directory):
                raise ConfigError(f"{FIELD}.dir", "must be a directory path", directory)
            directory = Path(directory).expanduser()
            if directory.exists() and not directory.is_dir():
                raise ConfigError(f"{FIELD}.dir", "exists and is not a directory", str(directory))

        base_url = kwargs.get("base_url")
        if base_url is not None and (
            not isinstance(base_url, str) or not base_url.startswith(("http://", "https://"))
        ):
            raise ConfigError(f"{FIELD}.base_url", "must be an http(s) URL", base_url)

        api_key = kwargs.get("api_key")
        if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
            # The value is deliberately left out of the error: it may be a mistyped secret.
            raise ConfigError(f"{FIELD}.api_key", "must be a non-empty string")
        if api_key is None and "api_key" in ctx.defaults:
            api_key = ctx.defaults["api_key"].value or None

        try:
            import wandb
        except ImportError as exc:
            raise ConfigError(
                FIELD,
                "needs the wandb package: pip install 'rlpulse[trackers]' (or pip install wandb)",
            ) from exc
        return cls(
            wandb,
            mode=mode,
            init_kwargs=init_kwargs,
            api_key=api_key.strip() if mode == "online" and api_key else None,
            directory=directory,
            base_url=base_url,
        )

    def open(self) -> None:
        """Create ``dir``; W&B runs start when their first step arrives."""
        if self._dir is not None:
            self._dir.mkdir(parents=True, exist_ok=True)

    def write(self, record: StepRecord) -> None:
        """Log the step's metrics as one history row at ``step``, then its samples' tables
        into the same row (W&B keeps a step's row open until a later step is logged)."""
        run = self._runs.get(record.run)
        if run is None:
            run = self._runs[record.run] = self._start(record.run, record.config)
        elif record.config:
            run.config.update(dict(record.config), allow_val_change=True)
        run.log(dict(record.metrics), step=record.step)

        def log_table(name: str, state: SampleState) -> None:
            t = samples_view.table(state)
            if not t.rows:  # every row was dropped: the count says so, an empty table not
                return
            data = [list(row) for row in t.rows]
            table = self._wandb.Table(columns=list(t.columns), data=data, allow_mixed_types=True)
            run.log({samples_view.tag(name): table}, step=record.step)

        self._samples.each(record.samples, log_table)

    @property
    def samples_failed(self) -> int:
        """Sample tables not written (logged, never raised: the step's numbers were)."""
        return self._samples.failed

    def forget(self, run: str) -> None:
        """The collector forgot ``run`` (it ended): its W&B run is finished."""
        wandb_run = self._runs.pop(run, None)
        if wandb_run is not None:
            wandb_run.finish()

    def close(self) -> None:
        """Finish every W&B run and wait until wandb has written (or uploaded) all of it;
        safe to call twice or before open()."""
        runs, self._runs = self._runs, {}
        errors = []
        for run in runs.values():
            try:
                run.finish()
            except Exception as exc:  # finish the others first, then report the first failure
                errors.append(exc)
        if self._started:
            self._started = False
            # finish() can return before wandb-core has written the run file (seen offline);
            # teardown waits for the service to flush everything and stop. The collector is the
            # only wandb user in its process, so stopping the service is ours to do.
            self._wandb.teardown()
        if errors:
            raise errors[0]

    def _start(self, run_name: str, config: Mapping[str, Any]) -> Any:
        settings = _settings(
            self._wandb.Settings,
            mode=self.mode,
            api_key=self._api_key,
            base_url=self._base_url,
            reinit="create_new",  # one W&B run per rlpulse run, side by side in one process
            silent=True,
            console="off",  # the collector's own output is not the training run's
            save_code=False,
            disable_git=True,
            x_disable_stats=True,  # the collector host's CPU/GPU are not the training job's
            x_disable_machine_info=True,
        )
        kwargs = {"name": run_name, **self._init_kwargs}
        if config:
            kwargs["config"] = dict(config)
        self._started = True
        return self._wandb.init(
            dir=str(self._dir) if self._dir is not None else None, settings=settings, **kwargs
        )


def _settings(cls: Any, **wanted: Any) -> Any:
    """``cls(**wanted)`` keeping the fields this wandb version has (and dropping None values)."""
    fields = getattr(cls, "model_fields", None)
    kept = {k: v for k, v in wanted.items() if v is not None and (fields is None or k in fields)}
    return cls(**kept)
