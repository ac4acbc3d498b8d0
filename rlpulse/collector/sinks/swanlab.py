"""SwanLab sink: one SwanLab experiment, one row of scalars per training step.

kwargs follow ROLL's ``tracker_kwargs`` for swanlab: ``login_kwargs`` (passed to
``swanlab.login``; its ``api_key`` falls back to ``SWANLAB_API_KEY``), ``project``, ``logdir``,
``experiment_name``, ``tags``, plus ``mode``, ``description`` and ``workspace``. Spellings of
different SwanLab versions are all accepted and translated to the installed one: ``logdir`` or
``log_dir``, ``experiment_name`` or ``name``, mode ``cloud`` or ``online`` (also ``offline``,
``local``, ``disabled``). ``mode`` defaults to ``SWANLAB_MODE``, else online.

Online mode logs in at ``open()`` with the key (``save=False`` unless ``login_kwargs`` says
otherwise, so nothing is written to disk); offline mode writes ``<logdir>/run-*`` for
``swanlab sync``; local mode keeps the run for the local dashboard (``swanlab watch``, which
needs ``swanlab[dashboard]``: without it, local mode fails at start-up). The key never appears in a
log line or an error message.

A step's samples (``StepRecord.samples``) are logged at its step as SwanLab texts, one list per
name under ``samples/<name>``: one text per row, its fields one per line, captioned with its
set, origin and key value (``rlpulse.collector.sinks.samples_view``). They are logged after
the numbers, so texts SwanLab refuses are logged and counted, and the numbers stay.

The run's configuration (``StepRecord.config``) is the SwanLab run's config: given to
``swanlab.init`` when it comes with the run's first step, merged in with ``run.config.update``
when it comes later.

SwanLab keeps one active run per process, so the sink follows the first rlpulse run it sees;
steps of other runs are skipped with a warning (configure one collector per run).

>>> import tempfile
>>> sink = SwanLabSink.from_kwargs({"project": "p", "mode": "offline",
...                                 "logdir": tempfile.mkdtemp()}, SinkContext())
>>> sink.mode
'offline'
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from rlpulse.collector.sinks import samples_view
from rlpulse.collector.sinks.base import Sink, SinkContext, reject_unknown
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.samples import SampleState

log = logging.getLogger(__name__)

FIELD = "tracker_kwargs.swanlab"
_KEYS = (
    "login_kwargs",
    "project",
    "workspace",
    "logdir",
    "log_dir",
    "experiment_name",
    "name",
    "description",
    "tags",
    "mode",
)
_MODES = ("online", "cloud", "offline", "local", "disabled")
_ALIASES = {"cloud": "online", "online": "cloud"}
# init() parameter spellings, newest first; the first one the installed swanlab has is used.
_PARAMS = {"log_dir": ("log_dir", "logdir"), "name": ("name", "experiment_name")}


class SwanLabSink(Sink):
    """Logs each step with ``run.log(metrics, step=step)`` to one SwanLab run.

    >>> SwanLabSink.from_kwargs({"mode": "disabled"}, SinkContext()).name
    'swanlab'
    """

    name = "swanlab"
    PATHS: ClassVar[tuple[str, ...]] = ("logdir", "log_dir")
    ENV: ClassVar[Mapping[str, str]] = {"mode": "SWANLAB_MODE", "api_key": "SWANLAB_API_KEY"}

    def __init__(
        self,
        swanlab: Any,
        *,
        mode: str,
        init_kwargs: Mapping[str, Any],
        login_kwargs: Mapping[str, Any] | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self._swanlab = swanlab
        self.mode = mode
        self._init_kwargs = dict(init_kwargs)
        self._login_kwargs = dict(login_kwargs) if login_kwargs is not None else None
        self._log_dir = log_dir
        self._run: Any = None
        self._run_name: str | None = None
        self._skipped: set[str] = set()
        self._samples = samples_view.SampleWriter(self.name)

    def __repr__(self) -> str:  # spelled out so that the key can never leak through a repr
        return f"SwanLabSink(mode={self.mode!r}, project={self._init_kwargs.get('project')!r})"

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], ctx: SinkContext) -> SwanLabSink:
        """Validate ``tracker_kwargs`` for swanlab; raise ConfigError naming the field."""
        reject_unknown(kwargs, _KEYS, FIELD)
        for a, b in (("logdir", "log_dir"), ("experiment_name", "name")):
            if kwargs.get(a) is not None and kwargs.get(b) is not None:
                raise ConfigError(f"{FIELD}.{b}", f"give {a} or {b}, not both")
        values: dict[str, Any] = {}
        for key in ("project", "workspace", "description"):
            values[key] = _string(kwargs, key)
        values["name"] = _string(kwargs, "experiment_name") or _string(kwargs, "name")
        tags = kwargs.get("tags")
        if tags is not None:
            if (
                isinstance(tags, str)
                or not isinstance(tags, Sequence)
                or not all(isinstance(t, str) for t in tags)
            ):
                raise ConfigError(f"{FIELD}.tags", "must be a list of strings", tags)
            values["tags"] = list(tags)

        log_dir = kwargs.get("logdir", kwargs.get("log_dir"))
        if log_dir is not None:
            if not isinstance(log_dir, str | os.PathLike) or not str(log_dir):
                raise ConfigError(f"{FIELD}.logdir", "must be a directory path", log_dir)
            log_dir = Path(log_dir).expanduser()
            if log_dir.exists() and not log_dir.is_dir():
                raise ConfigError(f"{FIELD}.logdir", "exists and is not a directory", str(log_dir))
            values["log_dir"] = str(log_dir)

        raw_mode = kwargs.get("mode")
        where = f"{FIELD}.mode"
        if raw_mode is None:
            default = ctx.defaults.get("mode")
            raw_mode, where = (default.value, default.source) if default else ("online", where)
        if not isinstance(raw_mode, str) or raw_mode.lower() not in _MODES:
            raise ConfigError(where, f"must be one of {', '.join(_MODES)}", raw_mode)
        mode = raw_mode.lower()

        try:
            import swanlab
        except ImportError as exc:
            raise ConfigError(
                FIELD,
                "needs the swanlab package: pip install 'rlpulse[trackers]' "
                "(or pip install swanlab)",
            ) from exc

        if mode == "local" and importlib.util.find_spec("swanboard") is None:
            raise ConfigError(
                where,
                "local mode needs the SwanLab dashboard: pip install 'swanlab[dashboard]'",
                raw_mode,
            )
        init_params = inspect.signature(swanlab.init).parameters
        mode = _installed_mode(mode, init_params.get("mode"))
        init_kwargs: dict[str, Any] = {"mode": mode}
        for key, value in values.items():
            if value is not None:
                spelling = next((p for p in _PARAMS.get(key, (key,)) if p in init_params), key)
                init_kwargs[spelling] = value

        login_kwargs = None
        if mode in ("online", "cloud"):
            login_kwargs = _login_kwargs(kwargs.get("login_kwargs"), swanlab, ctx)
        elif kwargs.get("login_kwargs") is not None and not isinstance(
            kwargs["login_kwargs"], Mapping
        ):
            raise ConfigError(f"{FIELD}.login_kwargs", "must be a mapping")
        return cls(
            swanlab,
            mode=mode,
            init_kwargs=init_kwargs,
            login_kwargs=login_kwargs,
            log_dir=log_dir,
        )

    def open(self) -> None:
        """Create ``logdir`` and, online, log in (the network is first touched here)."""
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
        if self._login_kwargs is not None:
            self._swanlab.login(**self._login_kwargs)
            self._login_kwargs = None  # logged in: drop the key from memory

    def write(self, record: StepRecord) -> None:
        """Log the step's metrics at ``step``; the SwanLab run starts on the first step."""
        if self._run is None:
            self._run = self._start(record.run, record.config)
            self._run_name = record.run
        elif record.run == self._run_name and record.config:
            self._run.config.update(dict(record.config))
        elif record.run != self._run_name:
            if record.run not in self._skipped:
                self._skipped.add(record.run)
                log.warning(
                    "swanlab: this sink logs run %r; skipping steps of run %r (SwanLab keeps "
                    "one run per process: use one collector per run)",
                    self._run_name,
                    record.run,
                )
            return
        run = self._run
        run.log(dict(record.metrics), step=record.step)

        def texts(name: str, state: SampleState) -> None:
            rows = [self._swanlab.Text(t, caption=c) for c, t in samples_view.captioned(state)]
            if rows:
                run.log({samples_view.tag(name): rows}, step=record.step)

        self._samples.each(record.samples, texts)

    @property
    def samples_failed(self) -> int:
        """Sample texts not written (logged, never raised: the step's numbers were)."""
        return self._samples.failed

    def forget(self, run: str) -> None:
        """The collector forgot ``run`` (it ended): a skipped one is no longer named, this
        sink's own run stays open (one run per process: it would not start another)."""
        self._skipped.discard(run)

    def close(self) -> None:
        """Finish the SwanLab run; safe to call twice or before open()."""
        run, self._run = self._run, None
        if run is not None:
            run.finish()

    def _start(self, run_name: str, config: Mapping[str, Any]) -> Any:
        kwargs = dict(self._init_kwargs)
        if config:
            kwargs["config"] = dict(config)
        name_param = next((k for k in _PARAMS["name"] if k in kwargs), None)
        if name_param is None:
            params = inspect.signature(self._swanlab.init).parameters
            name_param = next((p for p in _PARAMS["name"] if p in params), "experiment_name")
            kwargs[name_param] = run_name
        settings = _daemon_settings(self._swanlab)
        if settings is not None:
            kwargs["settings"] = settings
        return self._swanlab.init(**kwargs)


def _string(kwargs: Mapping[str, Any], key: str) -> str | None:
    value = kwargs.get(key)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{FIELD}.{key}", "must be a string", value)
    return value or None


def _installed_mode(mode: str, param: inspect.Parameter | None) -> str:
    """``mode`` as the installed swanlab spells it (``cloud`` before 0.7, ``online`` after)."""
    accepted = _literals(param.annotation) if param is not None else set()
    if accepted and mode not in accepted and _ALIASES.get(mode) in accepted:
        return _ALIASES[mode]
    return mode


def _literals(annotation: Any) -> set[str]:
    """Every string in a ``Literal[...]``, however it is nested in Optional/Union."""
    if isinstance(annotation, str):
        return set()
    found: set[str] = set()
    for arg in typing.get_args(annotation):
        found |= {arg} if isinstance(arg, str) else _literals(arg)
    return found


def _login_kwargs(raw: Any, swanlab: Any, ctx: SinkContext) -> dict[str, Any]:
    """Validated ``swanlab.login`` arguments, with the key from SWANLAB_API_KEY if not given."""
    where = f"{FIELD}.login_kwargs"
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(where, "must be a mapping")
    accepted = inspect.signature(swanlab.login).parameters
    login = dict(raw)
    for key in login:
        if key not in accepted:
            raise ConfigError(
                f"{where}.{key}", f"not an argument of swanlab.login: {', '.join(accepted)}"
            )
    api_key = login.get("api_key")
    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        # The value is deliberately left out of the error: it may be a mistyped secret.
        raise ConfigError(f"{where}.api_key", "must be a non-empty string")
    if api_key is None and ctx.defaults.get("api_key"):
        login["api_key"] = ctx.defaults["api_key"].value
    if "save" in accepted:
        login.setdefault("save", False)
    return login


def _daemon_settings(swanlab: Any) -> Any:
    """Settings for running inside the collector, where this swanlab version has them: no
    prompts; no hardware, monitor, pip-freeze or git probe (the collector's host and
    environment are not the training job's, and pip freeze takes seconds); no capture of the
    collector's own terminal output."""
    cls = getattr(swanlab, "Settings", None)
    fields = getattr(cls, "model_fields", {})
    if cls is None or not {"interactive", "probe", "terminal"} <= set(fields):
        return None
    probe = {"monitor": False, "hardware": False, "requirements": False, "git": False}
    return cls(interactive=False, probe=probe, terminal={"proxy_type": "none"})
