"""The gloo path of data parallelism: two processes sum gradients and counts exactly."""

from __future__ import annotations

import torch
import torch.multiprocessing as mp

from rlpulse.trainer.comm import TorchDistComm, all_reduce_gradients, free_port, global_count


def _rank(rank: int, init_method: str, out: dict) -> None:  # runs in a spawned process
    torch.set_num_threads(1)
    comm = TorchDistComm(init_method, rank, 2, backend="gloo", timeout_s=60)
    try:
        layer = torch.nn.Linear(3, 2)
        torch.nn.init.constant_(layer.weight, 1.0)
        torch.nn.init.zeros_(layer.bias)
        # Each rank sees different data; only the summed gradient is the full-batch gradient.
        x = torch.full((1, 3), float(rank + 1))
        layer(x).sum().backward()
        all_reduce_gradients(layer.parameters(), comm)
        out[rank] = (
            layer.weight.grad.clone(),
            layer.bias.grad.clone(),
            global_count(rank + 2, comm),
        )
    finally:
        comm.close()


def test_gloo_all_reduce_sums_gradients_and_counts() -> None:
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        out = manager.dict()
        init = f"tcp://127.0.0.1:{free_port()}"
        procs = [ctx.Process(target=_rank, args=(r, init, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0, 0]
        results = dict(out)
    for rank in (0, 1):
        weight_grad, bias_grad, count = results[rank]
        # d/dW of sum(W x) is x per output row; x = 1 on rank 0 and 2 on rank 1: 1 + 2 = 3.
        assert torch.equal(weight_grad, torch.full((2, 3), 3.0))
        assert torch.equal(bias_grad, torch.full((2,), 2.0))
        assert count == 5.0
