"""ROLL's generations as ``Samples``, from the driver: each step's trained batch as
``rollout/samples``, each validation's as ``val/samples`` (``tracker_kwargs.samples``, on by
default), ranked by their ``score``.

ROLL's driver holds each whole batch (it computes its data metrics there), so the driver logs
the rows, once each, as its own: no rank's row twice, none missed. Where (the driver only,
:class:`SamplesHooks`, installed by ``roll.register``):

* rlvr (and rlvr_vlm): ``MetricsManager.add_all_metrics(global_step, batch, ...)``, the trained
  batch with its advantages, at every step that trains (a skipped step has none);
* agentic: ``compute_train_data_metrics(batch)``, at ``batch.meta_info["global_step"]``;
* rlvr's (and rlvr_vlm's) validation: in ``val``, the batch the validation scheduler returned,
  read when ``val`` pops its scores off it (``DataProto.pop``), at ``val``'s ``global_step``;
* agentic's validation: ``dump_rollout_trajectories(path, global_step, eval_batch)`` as
  ``AgenticPipeline.val`` calls it (on its own thread: a thread-local tells it from the
  training rollout's call);
* the tokenizer: the pipeline's own (``pipeline.tokenizer``), taken when a pipeline whose
  tracker is rlpulse's has been built.

A row (:func:`numbers`, :func:`texts`): ``prompt`` and ``response``, the tokens of
``prompt_mask`` and the rest of ``attention_mask`` decoded with the pipeline's tokenizer
(special tokens kept, padding left out; agentic's response holds the later turns, as ROLL's
own log shows them); ``score`` (rlvr's ``scores``, agentic's ``episode_scores``: the key);
``reward`` (the token-level rewards summed, ROLL's ``critic/rewards``); ``advantage`` (the
mean over the response tokens, ``response_mask[:, 1:]``); ``response_length`` and
``prompt_length`` in tokens; ``trained`` (the sample has tokens in ``final_response_mask``:
ROLL trains on it); ``logprob_mismatch`` (mean absolute difference of the engine's and the
trainer's log-probabilities over the response, where ROLL kept the engine's); ``domain`` and
``tag`` (rlvr's dataset columns; agentic's ``tags``) and agentic's ``traj_id``. A field the
batch lacks is left out.

Cost: the numbers are whole-batch reductions, one ``tolist`` each; the texts are decoded for
the rows kept only (``reduce_then_fill``: at most 3 ``samples_k``). ROLL's batches are
thousands of responses of thousands of tokens: decoding them all took seconds a step.

Never raises into ROLL: a failure is counted (``stats()["samples_failed"]``) and warned about
once; a ROLL function that is not what the hooks wrap is left alone, with a warning.

>>> import torch; from types import SimpleNamespace
>>> batch = SimpleNamespace(batch={"scores": torch.tensor([1.0, 0.0])},
...                         non_tensor_batch={"tag": ["math", "code"]})
>>> numbers(batch, "rlvr")
[{'score': 1.0, 'tag': 'math'}, {'score': 0.0, 'tag': 'code'}]
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from functools import wraps
from types import ModuleType
from typing import Any

from rlpulse.producer.integrations import roll_compat as C
from rlpulse.producer.integrations.onimport import OnImport
from rlpulse.producer.samples import reduce_then_fill
from rlpulse.schemas import metrics as M

log = logging.getLogger("rlpulse.integrations.roll")

KEY = "score"
"""The field samples are ranked by: the verifier's (rlvr) or environment's (agentic) score."""
_MARK = "_rlpulse_samples_of"


def _get(table: Any, name: str) -> Any:
    """``table[name]`` (a ``DataProto``'s ``batch`` or ``non_tensor_batch``), None if absent."""
    return table.get(name)


def _per_row(values: Any) -> list[Any] | None:
    return None if values is None else values.tolist()


def _masked_mean(values: Any, mask: Any) -> list[float | None]:
    mask = mask.double()
    counts = mask.sum(-1)
    means = (values.double() * mask).sum(-1) / counts.clamp(min=1)
    return [m if n > 0 else None for m, n in zip(means.tolist(), counts.tolist(), strict=True)]


def numbers(batch: Any, kind: str) -> list[dict[str, Any]]:
    """The rows of ``batch`` (a ``DataProto``) without their texts; ``kind`` ``rlvr`` or
    ``agentic`` (see the module docstring)."""
    tensors, objects = batch.batch, batch.non_tensor_batch
    response = _get(tensors, "response_mask")
    tokens = response[:, 1:].bool() if response is not None else None
    columns: dict[str, list[Any] | None] = {}
    if kind == "agentic":
        scores = _get(objects, "episode_scores")
        columns[KEY] = None if scores is None else [float(s) for s in scores]
    else:
        columns[KEY] = _per_row(_get(tensors, "scores"))
    rewards = _get(tensors, "token_level_rewards")
    columns["reward"] = _per_row(rewards.double().sum(-1)) if rewards is not None else None
    advantages = _get(tensors, "advantages")
    if advantages is not None and tokens is not None:
        columns["advantage"] = _masked_mean(advantages, tokens)
    if tokens is not None:
        columns["response_length"] = _per_row(tokens.sum(-1))
    prompt = _get(tensors, "prompt_mask")
    if prompt is not None:
        columns["prompt_length"] = _per_row(prompt.bool().sum(-1))
    final = _get(tensors, "final_response_mask")
    if final is not None:
        columns["trained"] = _per_row(final.bool().any(-1))
    infer, old = _get(tensors, "infer_logprobs"), _get(tensors, "old_log_probs")
    if infer is not None and old is not None and tokens is not None:
        columns["logprob_mismatch"] = _masked_mean((infer.double() - old.double()).abs(), tokens)
    names = {"domain": "domain", "tag": "tag"} if kind != "agentic" else {"tags": "tag"}
    for source, field in (*names.items(), *(("traj_id", "traj_id"),) * (kind == "agentic")):
        values = _get(objects, source)
        if values is not None:
            columns[field] = [None if v is None else str(v) for v in values]
    if columns[KEY] is None:
        raise ValueError(
            f"the batch has no score ({'episode_scores' if kind == 'agentic' else 'scores'})"
        )
    kept = {name: values for name, values in columns.items() if values is not None}
    n = len(kept[KEY])
    return [{name: values[i] for name, values in kept.items()} for i in range(n)]


def texts(batch: Any, indices: Sequence[int], tokenizer: Any) -> list[dict[str, str]]:
    """``prompt`` and ``response`` of rows ``indices`` of ``batch``, decoded."""
    tensors = batch.batch
    ids, prompt = _get(tensors, "input_ids"), _get(tensors, "prompt_mask")
    attention = _get(tensors, "attention_mask")
    if ids is None or prompt is None or attention is None:
        raise ValueError("the batch has no input_ids, prompt_mask and attention_mask to decode")
    rows = list(indices)
    ids, prompt, attention = ids[rows], prompt[rows].bool(), attention[rows].bool()
    asked = [r[m].tolist() for r, m in zip(ids, prompt, strict=True)]
    asked += [r[m].tolist() for r, m in zip(ids, attention & ~prompt, strict=True)]
    decoded = tokenizer.batch_decode(asked, skip_special_tokens=False)
    n = len(rows)
    return [{"prompt": p, "response": r} for p, r in zip(decoded[:n], decoded[n:], strict=True)]


class RollSamples:
    """What one driver producer logs of ROLL's batches (the tracker's, when ``samples``)."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self.tokenizer: Any = None
        """The pipeline's tokenizer (``SamplesHooks`` sets it once the pipeline is built)."""
        self._counts = {"samples_logged": 0, "val_samples_logged": 0, "samples_failed": 0}
        self._warned: set[str] = set()

    def rollout(self, batch: Any, step: Any, kind: str) -> None:
        """Log a trained batch's rows at ``step``."""
        self._log(M.ROLLOUT_SAMPLES.name, batch, step, kind, "samples_logged")

    def validation(self, batch: Any, step: Any, kind: str) -> None:
        """Log a validation batch's rows at ``step``."""
        self._log(M.VAL_SAMPLES.name, batch, step, kind, "val_samples_logged")

    def _log(self, name: str, batch: Any, step: Any, kind: str, counter: str) -> None:
        try:
            if self.tokenizer is None:
                raise ValueError("no tokenizer: the pipeline was not seen being built")
            if step is None or not hasattr(batch, "non_tensor_batch"):
                raise ValueError(f"no step ({step!r}) or no DataProto ({type(batch).__name__})")
            producer, tokenizer = self.producer, self.tokenizer
            state = reduce_then_fill(
                numbers(batch, kind),
                KEY,
                lambda rows: texts(batch, rows, tokenizer),
                origin=(producer.role, producer.rank),
                limits=producer.config.sample_limits(),
            )
            producer.log({name: state}, step=int(step))
            self._counts[counter] += 1
        except Exception as exc:  # never into ROLL's loop
            self._counts["samples_failed"] += 1
            self._warn(f"{name}:{type(exc).__name__}", f"{name} not logged: {exc!r}")

    def stats(self) -> dict[str, int]:
        return dict(self._counts)

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("rlpulse ROLL samples: %s", message)


class SamplesHooks:
    """The driver's wrappers of ROLL's functions that hold the batches (see the module
    docstring); :attr:`current` is the samples of the pipeline last built with rlpulse's
    tracker."""

    def __init__(self) -> None:
        self.current: RollSamples | None = None
        self._in_val = threading.local()
        self._on_import: OnImport | None = None
        self._undo: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        if self._on_import is None:
            self._on_import = OnImport(C.SAMPLES_HOOKS, self._wrap)
            self._on_import.install()

    def uninstall(self) -> None:
        if self._on_import is not None:
            self._on_import.uninstall()
            self._on_import = None
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)
        self.current = None

    def _wrap(self, module: ModuleType) -> None:
        for owner_name, attr, how in C.SAMPLES_HOOKS[module.__name__]:
            owner = getattr(module, owner_name) if owner_name else module
            original = getattr(owner, attr, None) if owner is not None else None
            if original is None or getattr(original, _MARK, False):
                continue
            problem = C.check_samples_hook(original, how)
            if problem:
                log.warning(
                    "rlpulse ROLL samples: %s.%s %s; no samples from it (tested with ROLL %s)",
                    module.__name__,
                    f"{owner_name}.{attr}" if owner_name else attr,
                    problem,
                    C.TESTED_ROLL[:7],
                )
                continue
            wrapped = getattr(self, f"_{how}")(original, module.__name__)
            setattr(wrapped, _MARK, True)
            self._undo.append((owner, attr, original))
            setattr(owner, attr, wrapped)

    def _kind(self, module: str) -> str:
        return "agentic" if ".agentic." in module else "rlvr"

    # ------------------------------------------------------------------ the wrappers

    def _built(self, original: Callable[..., Any], module: str) -> Callable[..., Any]:
        """A pipeline's ``__init__``: its tokenizer for its tracker's samples."""
        hooks = self

        @wraps(original)
        def __init__(pipeline: Any, *args: Any, **kwargs: Any) -> None:
            original(pipeline, *args, **kwargs)
            samples = getattr(getattr(pipeline, "tracker", None), "samples", None)
            if isinstance(samples, RollSamples):
                samples.tokenizer = getattr(pipeline, "tokenizer", None)
                hooks.current = samples

        return __init__

    def _validating(self, original: Callable[..., Any], module: str) -> Callable[..., Any]:
        """A pipeline's ``val(global_step, ...)``: marks this thread as validating."""
        state = self._in_val

        @wraps(original)
        def val(pipeline: Any, global_step: Any, *args: Any, **kwargs: Any) -> Any:
            state.step, state.done = global_step, False
            try:
                return original(pipeline, global_step, *args, **kwargs)
            finally:
                state.step = None

        return val

    def _trained(self, original: Callable[..., Any], module: str) -> Callable[..., Any]:
        """``MetricsManager.add_all_metrics(global_step, batch, ...)``: the trained batch."""
        hooks = self

        @wraps(original)
        def add_all_metrics(manager: Any, global_step: Any, batch: Any, *a: Any, **kw: Any) -> Any:
            out = original(manager, global_step, batch, *a, **kw)
            if hooks.current is not None:
                hooks.current.rollout(batch, global_step, "rlvr")
            return out

        return add_all_metrics

    def _trained_agentic(self, original: Callable[..., Any], module: str) -> Callable[..., Any]:
        """agentic's ``compute_train_data_metrics(batch)``: the trained batch."""
        hooks = self

        @wraps(original)
        def compute_train_data_metrics(batch: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(batch, *args, **kwargs)
            if hooks.current is not None:
                step = getattr(batch, "meta_info", {}).get("global_step")
                hooks.current.rollout(batch, step, "agentic")
            return out

        return compute_train_data_metrics

    def _popped(self, original: Callable[..., Any], module: str) -> Callable[..., Any]:
        """``DataProto.pop``: in rlvr's ``val``, the batch as it was, when its scores go."""
        hooks, state = self, self._in_val

        @wraps(original)
        def pop(data: Any, *args: Any, **kwargs: Any) -> Any:
            step = getattr(state, "step", None)
            if step is not None and not state.done and hooks.current is not None:
                keys = kwargs.get("batch_keys", args[0] if args else None)
                if keys is not None and "scores" in keys:
                    state.done = True
                    hooks.current.validation(data, step, "rlvr")
            return original(data, *args, **kwargs)

        return pop

    def _dumped(self, original: Callable[..., Any], module: str) -> Callable[..., Any]:
        """agentic's ``dump_rollout_trajectories(path, global_step, data)``: in ``val``, the
        validation batch."""
        hooks, state = self, self._in_val

        @wraps(original)
        def dump_rollout_trajectories(
            path: Any, global_step: Any, data: Any, *a: Any, **kw: Any
        ) -> Any:
            if getattr(state, "step", None) is not None and hooks.current is not None:
                hooks.current.validation(data, global_step, "agentic")
            return original(path, global_step, data, *a, **kw)

        return dump_rollout_trajectories
