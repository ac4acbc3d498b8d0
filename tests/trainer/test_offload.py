"""Onload/offload of model and optimizer state (the GPU half skips without CUDA)."""

from __future__ import annotations

import pytest
import torch

from rlpulse.trainer.offload import StateMover, resolve_device


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()  # creates exp_avg / exp_avg_sq state
    return model, opt


def test_cpu_device_resolves_and_moves_are_harmless() -> None:
    model, opt = _model_and_optimizer()
    mover = StateMover(model, opt, resolve_device("cpu"), enabled=True)
    before = model.weight.detach().clone()
    mover.onload()
    mover.offload()
    assert torch.equal(model.weight, before)
    assert all(
        v.device.type == "cpu"
        for s in opt.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_onload_and_offload_move_weights_and_optimizer_state() -> None:
    model, opt = _model_and_optimizer()
    mover = StateMover(model, opt, torch.device("cuda"), enabled=True)
    mover.onload()
    assert model.weight.device.type == "cuda"
    assert all(s["exp_avg"].device.type == "cuda" for s in opt.state.values())
    allocated = torch.cuda.memory_allocated()
    mover.offload()
    assert model.weight.device.type == "cpu"
    assert all(s["exp_avg"].device.type == "cpu" for s in opt.state.values())
    assert torch.cuda.memory_allocated() < allocated


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_vllm_engine_generates_and_takes_new_weights(tmp_path) -> None:
    pytest.importorskip("vllm")
    from rlpulse.trainer.config import ModelConfig
    from rlpulse.trainer.model import build_policy
    from rlpulse.trainer.rollout_vllm import EngineSettings, VLLMEngine
    from rlpulse.trainer.tokenizer import build_tokenizer

    tok = build_tokenizer()
    policy = build_policy(ModelConfig(num_heads=2), tok, seed=0)
    policy.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    engine = VLLMEngine(str(tmp_path), EngineSettings(max_new_tokens=4, seed=0))
    prompt = tok("abc>", add_special_tokens=False).input_ids
    before = engine.generate([prompt], 1.0, 1.0, greedy=True)
    zeros = {k: torch.zeros_like(v) for k, v in policy.state_dict().items()}
    engine.load_weights(zeros)
    after = engine.generate([prompt], 1.0, 1.0, greedy=True)
    assert (len(before[0]) >= 1 and after != before) or after == [[0] * len(after[0])]
