"""TensorBoard sink: one event file per run under ``log_dir``, one scalar tag per metric.

Written with the ``tensorboard`` package's own protos and record writer (never torch), one
``Event`` per step holding every metric as a ``simple_value`` scalar, so TensorBoard and its
``EventAccumulator`` read them as scalars at ``step`` = training step. Writes are synchronous and
flushed per step: the fan-out thread that calls ``write()`` is the only thread involved.

TensorBoard scalars are float32 (``Summary.Value.simple_value``): values are what the jsonl sink
writes, rounded to float32 (integers above 2**24, such as large token counts, lose their last
digits; Prometheus and jsonl keep float64).

A step's samples (``StepRecord.samples``) are text summaries in the same event, one per name
under ``samples/<name>``: a markdown table (``rlpulse.collector.sinks.samples_view``) that
TensorBoard's Text tab renders, its cells cut to 1000 characters. A name whose table cannot be
made is logged and counted, and the step's scalars are written all the same.

The run's configuration (``StepRecord.config``, on the step after it arrived) is written as
the run's hyper-parameters, before that step: the HParams plugin's session start
(``summary_v2.hparams_pb``, what ``add_hparams`` writes), its keys dotted
(``actor_train.model_args.dtype``), lists and nulls as their JSON text, the run name as the
trial. TensorBoard's HParams tab then lists the run with its configuration.

>>> import tempfile
>>> sink = TensorBoardSink.from_kwargs({"log_dir": tempfile.mkdtemp()}, SinkContext())
>>> sink.open()
>>> sink.write(StepRecord(run="r1", step=0, metrics={"critic/score/mean": 0.5}))
>>> sink.close()
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from rlpulse.collector.sinks import samples_view
from rlpulse.collector.sinks.base import Sink, SinkContext, reject_unknown, required_path
from rlpulse.schemas import runconfig
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.samples import SampleState
from rlpulse.schemas.sketch import coarse_buckets, decode as decode_sketch

FIELD = "tracker_kwargs.tensorboard"
_KEYS = ("log_dir",)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")


class TensorBoardSink(Sink):
    """Writes ``<log_dir>/<run>/events.out.tfevents.*`` files TensorBoard reads directly.

    Each run gets its own sub-directory, so TensorBoard pointed at ``log_dir`` shows one
    line per run.

    >>> TensorBoardSink.from_kwargs({"log_dir": "/tmp/tb"}, SinkContext()).name
    'tensorboard'
    """

    name = "tensorboard"
    PATHS: ClassVar[tuple[str, ...]] = ("log_dir",)

    def __init__(
        self, log_dir: Path, *, event_pb2: Any, summary_pb2: Any, record_writer: Any
    ) -> None:
        self._log_dir = log_dir
        self._event_pb2 = event_pb2
        self._summary_pb2 = summary_pb2
        self._record_writer = record_writer
        self._files: dict[str, tuple[BinaryIO, Any]] = {}
        self._created = 0
        self._samples = samples_view.SampleWriter(self.name)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], ctx: SinkContext) -> TensorBoardSink:
        """Validate ``tracker_kwargs`` for tensorboard (``log_dir``, required)."""
        reject_unknown(kwargs, _KEYS, FIELD)
        path = Path(required_path(kwargs, "log_dir", FIELD, "a directory path")).expanduser()
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{FIELD}.log_dir", "exists and is not a directory", str(path))
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.record_writer import RecordWriter
        except ImportError as exc:
            raise ConfigError(
                FIELD,
                "needs the tensorboard package: pip install 'rlpulse[trackers]' "
                f"(or pip install tensorboard); import failed: {exc}",
            ) from exc
        return cls(path, event_pb2=event_pb2, summary_pb2=summary_pb2, record_writer=RecordWriter)

    def open(self) -> None:
        """Create ``log_dir``; event files are created when a run's first step arrives."""
        self._log_dir.mkdir(parents=True, exist_ok=True)

    def write(self, record: StepRecord) -> None:
        """Append the step as one event and flush it to disk."""
        writer = self._writer(record.run)
        if record.config:
            writer.write(self._hparams(record).SerializeToString())
        values = [
            self._summary_pb2.Summary.Value(tag=name, simple_value=float(value))
            for name, value in record.metrics.items()
        ]
        for name, sketch in record.distributions.items():  # a histogram per distribution
            values.append(
                self._summary_pb2.Summary.Value(
                    tag=name, histo=self._histogram(name, sketch, record)
                )
            )

        def text(name: str, state: SampleState) -> None:
            values.append(self._text(samples_view.tag(name), samples_view.markdown(name, state)))

        self._samples.each(record.samples, text)
        event = self._event_pb2.Event(
            wall_time=record.time or time.time(),
            step=record.step,
            summary=self._summary_pb2.Summary(value=values),
        )
        writer.write(event.SerializeToString())
        writer.flush()

    def _histogram(self, name: str, sketch: bytes, record: StepRecord) -> Any:
        """A distribution's merged sketch as TensorBoard's ``HistogramProto`` (buckets 22%
        wide, ``rlpulse.schemas.sketch.coarse_buckets``; count, sum, min and max exact)."""
        upper, counts = coarse_buckets(decode_sketch(sketch))
        n = float(counts.sum())
        m = record.metrics
        return self._summary_pb2.HistogramProto(
            min=m.get(f"{name}/min", float(upper[0]) if len(upper) else 0.0),
            max=m.get(f"{name}/max", float(upper[-1]) if len(upper) else 0.0),
            num=n,
            sum=m.get(f"{name}/mean", 0.0) * n,
            bucket_limit=upper.tolist(),
            bucket=counts.astype(float).tolist(),
        )

    def _hparams(self, record: StepRecord) -> Any:
        """The run's configuration as the HParams plugin's session start, in its own event."""
        from tensorboard.plugins.hparams.summary_v2 import hparams_pb

        start = record.time or time.time()
        summary = hparams_pb(runconfig.flat(record.config), record.run, start)
        return self._event_pb2.Event(wall_time=start, step=record.step, summary=summary)

    def _text(self, tag: str, markdown: str) -> Any:
        """A text summary (TensorBoard's text plugin: a scalar string tensor) of ``markdown``."""
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2
        from tensorboard.plugins.text.metadata import create_summary_metadata

        tensor = tensor_pb2.TensorProto(
            dtype=types_pb2.DT_STRING,
            tensor_shape=tensor_shape_pb2.TensorShapeProto(),
            string_val=[markdown.encode("utf-8")],
        )
        return self._summary_pb2.Summary.Value(
            tag=tag,
            metadata=create_summary_metadata(display_name=None, description=None),
            tensor=tensor,
        )

    @property
    def samples_failed(self) -> int:
        """Sample tables not written (logged, never raised: the step's scalars were)."""
        return self._samples.failed

    def written_through(self) -> dict[str, int]:
        """The last step of each run already in the event files (keyed by the run's folder
        name, which is the run name unless it had characters unsafe in a path), so a
        restarted collector with a ``state_dir`` does not write a step twice."""
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        out: dict[str, int] = {}
        if not self._log_dir.is_dir():
            return out
        for run_dir in self._log_dir.iterdir():
            for path in run_dir.glob("events.out.tfevents.*") if run_dir.is_dir() else ():
                for event in EventFileLoader(str(path)).Load():
                    if event.HasField("summary"):
                        out[run_dir.name] = max(out.get(run_dir.name, -1), event.step)
        return out

    def forget(self, run: str) -> None:
        """The collector forgot ``run`` (it ended): its event file is closed."""
        entry = self._files.pop(run, None)
        if entry is not None:
            entry[0].close()

    def close(self) -> None:
        """Close every event file; safe to call twice or before open()."""
        files, self._files = self._files, {}
        for fh, _ in files.values():
            fh.close()

    def _writer(self, run: str) -> Any:
        entry = self._files.get(run)
        if entry is None:
            run_dir = self._log_dir / (_UNSAFE.sub("_", run).strip(".") or "run")
            run_dir.mkdir(parents=True, exist_ok=True)
            fh = self._create(run_dir)
            writer = self._record_writer(fh)
            header = self._event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
            writer.write(header.SerializeToString())
            entry = self._files[run] = (fh, writer)
        return entry[1]

    def _create(self, run_dir: Path) -> BinaryIO:
        # The name TensorBoard globs for; time, host, pid and a counter keep files apart.
        stamp = f"{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        while True:
            self._created += 1
            try:
                return open(run_dir / f"events.out.tfevents.{stamp}.{self._created}", "xb")
            except FileExistsError:
                continue  # another sink of this process, this second: take the next number
