"""Caller cost of logging one step (issue item 1), in the training process.

Contenders, all alive in this one process and measured side by side:

* ``rlpulse``: ``Producer.log(data, step)`` connected to a running collector daemon;
* ``floor``: ``msgpack.packb(data)`` + one non-blocking ZeroMQ ``send`` on a PUSH socket
  connected to a process that drains it: the least any out-of-process logger can do;
* ``wandb``: ``run.log(data, step=i)``, offline, writing under a temporary directory;
* ``tensorboard``: ``SummaryWriter.add_scalar`` per value (``torch.utils.tensorboard``);
* ``swanlab``: ``swanlab.log(data, step=i)``, offline;
* ``prometheus``: ``Gauge.labels(run=...).set(v)`` per value (``prometheus_client``);
* ``null``: an empty call, the cost of the timer itself.

Two steps are logged: 60 scalars, and a realistic step of 20 per-token tensors of 4,096 tokens
(float32, with a response mask) plus 40 scalars. rlpulse takes the tensors as
``Masked(tensor, mask)`` and reduces them itself; for every other contender (the floor
included) the timed call also holds what a user must do first: the masked mean, max and min
of each tensor (one ``torch.stack(...).tolist()`` per tensor), so they log 100 scalars.

torch runs with one intra-op thread. Each call is timed alone (``perf_counter_ns``) and followed by 1 ms of "training" (a sleep,
so background threads and processes get to run, as between real steps). Contenders take
turns in blocks of 50 calls, in a shuffled order every round (interleaved, never one after
the other), with a 50 ms pause after each block, and then as long as it takes for the
process to be quiet again (:func:`settle`): a contender's background threads (swanlab's,
wandb's) work on after its block, and without the wait they ran into the next contender's
block, holding the GIL against its calls and billing it for their CPU. The CPU of the whole
process and its helper processes (wandb-core and the like; not the collector or the drain)
is read around every block, the wait included, so the table can also show the CPU a call
costs in total, background included, above the ``null`` contender's baseline.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import psutil
import zmq

from benchmarks.common import CpuSteal, load_snapshot, summarize, write_json

N_SCALARS = 60
N_TENSORS, TOKENS, EXTRA_SCALARS = 20, 4096, 40
BLOCK = 50
PACE_S = 0.001
PAUSE_S = 0.05
QUIET_WINDOW_S = 0.02
QUIET_SHARE = 0.05
"""The process is quiet when its other threads and its helper processes used less than this
share of one CPU over a window (idle, they use under 1%: heartbeats and polls)."""
SETTLE_MAX_S = 5.0


# ---------------------------------------------------------------------------- payloads


class Payloads:
    """Pre-built inputs, cycled through so no contender sees the same numbers twice in a row."""

    def __init__(self, seed: int = 0) -> None:
        import torch

        # One intra-op thread: on 2 shared cores an OpenMP pool that spins and gets
        # descheduled turns a 4k-element reduction into tens of milliseconds (seen here).
        torch.set_num_threads(1)
        gen = torch.Generator().manual_seed(seed)
        rnd = random.Random(seed)
        self.scalar_names = [f"bench/scalar_{i:02d}" for i in range(N_SCALARS)]
        self.scalars = [{name: rnd.uniform(-1, 1) for name in self.scalar_names} for _ in range(16)]
        self.tensor_names = [f"bench/tokens_{i:02d}" for i in range(N_TENSORS)]
        self.extra_names = [f"bench/extra_{i:02d}" for i in range(EXTRA_SCALARS)]
        self.tensors = [
            [torch.randn(TOKENS, generator=gen) for _ in range(N_TENSORS)] for _ in range(4)
        ]
        self.masks = [torch.rand(TOKENS, generator=gen) < 0.85 for _ in range(4)]
        self.extras = [{name: rnd.uniform(-1, 1) for name in self.extra_names} for _ in range(4)]


def user_reduce(p: Payloads, i: int) -> dict[str, float]:
    """What a user of a scalar tracker writes for the realistic step (verl-style): masked
    mean, max and min of every per-token tensor, plus the plain scalars."""
    import torch

    k = i % 4
    mask = p.masks[k]
    out: dict[str, float] = {}
    for name, t in zip(p.tensor_names, p.tensors[k], strict=True):
        sel = t[mask]
        s, mn, mx = torch.stack([sel.sum(), sel.min(), sel.max()]).tolist()
        out[name + "/mean"] = s / sel.numel()
        out[name + "/max"] = mx
        out[name + "/min"] = mn
    out.update(p.extras[k])
    return out


# ---------------------------------------------------------------------------- contenders


class Contender:
    """``log(i, workload)`` is the timed call; ``close()`` after the measurement."""

    name = "?"
    helper_pids: tuple[int, ...] = ()

    def __init__(self, p: Payloads) -> None:
        self.p = p

    def log(self, i: int, workload: str) -> None:
        d = self.p.scalars[i % 16] if workload == "scalars60" else user_reduce(self.p, i)
        self.log_dict(d, i)

    def log_dict(self, d: dict[str, float], i: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Null(Contender):
    name = "null"

    def log(self, i: int, workload: str) -> None:
        pass


class Rlpulse(Contender):
    name = "rlpulse"

    def __init__(self, p: Payloads, tmp: Path) -> None:
        super().__init__(p)
        from rlpulse.collector.launch import start_collector
        from rlpulse.producer import Masked, Producer

        self._masked = Masked
        out = tmp / "rlpulse.jsonl"
        self.collector = start_collector(
            {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(out)}}},
            stdout=subprocess.DEVNULL,
            stderr=(tmp / "collector.log").open("w"),
        )
        self.helper_pids = (self.collector.proc.pid,)
        # The topology declared, as the trainer and verl's hook declare it: the collector
        # emits steps at once instead of waiting settle_s for other roles (meanwhile a
        # producer logging every millisecond fills max_open_steps and is held back).
        self.producer = Producer(
            self.collector.address,
            run="bench",
            role="actor_train",
            expected_roles={"actor_train": 1},
        )

    def log(self, i: int, workload: str) -> None:
        if workload == "scalars60":
            self.producer.log(self.p.scalars[i % 16], step=i)
            return
        p, k = self.p, i % 4
        mask, masked = p.masks[k], self._masked
        d: dict[str, Any] = {
            name: masked(t, mask) for name, t in zip(p.tensor_names, p.tensors[k], strict=True)
        }
        d.update(p.extras[k])
        self.producer.log(d, step=i)

    def close(self) -> None:
        self.producer.close()
        self.collector.stop()


def _drain(ready_file: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.bind("tcp://127.0.0.1:*")
    Path(ready_file).write_text(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    while True:
        sock.recv()


class Floor(Contender):
    name = "floor"

    def __init__(self, p: Payloads, tmp: Path) -> None:
        super().__init__(p)
        ready = tmp / "drain-ready"
        self.proc = mp.get_context("spawn").Process(target=_drain, args=(str(ready),), daemon=True)
        self.proc.start()
        while not ready.exists() or not ready.read_text():
            time.sleep(0.01)
        self.helper_pids = (self.proc.pid,)  # type: ignore[assignment]
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(ready.read_text())
        self.packb = msgpack.packb

    def log_dict(self, d: dict[str, float], i: int) -> None:
        try:  # noqa: SIM105 - contextlib.suppress costs more than the send being measured
            self.sock.send(self.packb(d), zmq.NOBLOCK)
        except zmq.Again:
            pass

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()
        self.proc.kill()


class Wandb(Contender):
    name = "wandb"

    def __init__(self, p: Payloads, tmp: Path) -> None:
        super().__init__(p)
        import wandb

        self.run = wandb.init(
            project="rlpulse-bench",
            mode="offline",
            dir=str(tmp),
            settings=wandb.Settings(console="off", silent=True),
        )

    def log_dict(self, d: dict[str, float], i: int) -> None:
        self.run.log(d, step=i)

    def close(self) -> None:
        self.run.finish()


class TensorBoard(Contender):
    name = "tensorboard"

    def __init__(self, p: Payloads, tmp: Path) -> None:
        super().__init__(p)
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(tmp / "tb"))

    def log_dict(self, d: dict[str, float], i: int) -> None:
        add = self.writer.add_scalar
        for k, v in d.items():
            add(k, v, i)

    def close(self) -> None:
        self.writer.close()


class SwanLab(Contender):
    name = "swanlab"

    def __init__(self, p: Payloads, tmp: Path) -> None:
        super().__init__(p)
        import swanlab

        self.swanlab = swanlab
        self.run = swanlab.init(project="rlpulse-bench", mode="offline", logdir=str(tmp / "swan"))

    def log_dict(self, d: dict[str, float], i: int) -> None:
        self.swanlab.log(d, step=i)

    def close(self) -> None:
        self.swanlab.finish()


class Prometheus(Contender):
    name = "prometheus"

    def __init__(self, p: Payloads, tmp: Path) -> None:
        super().__init__(p)
        from prometheus_client import CollectorRegistry, Gauge

        self.registry = CollectorRegistry()
        names = [*p.scalar_names, *p.extra_names]
        names += [f"{n}/{s}" for n in p.tensor_names for s in ("mean", "max", "min")]
        self.gauges = {
            n: Gauge(n.replace("/", "_"), n, ["run"], registry=self.registry) for n in names
        }

    def log_dict(self, d: dict[str, float], i: int) -> None:
        g = self.gauges
        for k, v in d.items():
            g[k].labels(run="bench").set(v)


FACTORIES: dict[str, Callable[[Payloads, Path], Contender]] = {
    "null": lambda p, tmp: Null(p),
    "floor": Floor,
    "rlpulse": Rlpulse,
    "wandb": Wandb,
    "tensorboard": TensorBoard,
    "swanlab": SwanLab,
    "prometheus": Prometheus,
}


# ---------------------------------------------------------------------------- measuring


class CpuMeter:
    """CPU seconds of this process (every thread) plus its helper child processes, minus
    the processes that stand for the remote end (collector, drain)."""

    def __init__(self, exclude: set[int]) -> None:
        self.me = psutil.Process()
        self.exclude = exclude
        self._children: dict[int, psutil.Process] = {}

    def read(self) -> float:
        # This process from the kernel's nanosecond clock (psutil's cpu_times counts 10 ms
        # ticks: +-10 ms a block, +-45 µs a call over a run, more than a send costs);
        # helper processes (wandb-core and the like) from psutil.
        for child in self.me.children(recursive=True):
            if child.pid not in self.exclude:
                self._children.setdefault(child.pid, child)
        return time.process_time() + self._helpers()

    def background(self) -> float:
        """CPU seconds of this process's other threads and of the helpers seen by
        :meth:`read` (no scan for new ones: cheap enough to call every few ms; a helper's
        time comes in 10 ms ticks)."""
        return time.process_time() - time.thread_time() + self._helpers()

    def _helpers(self) -> float:
        """CPU seconds of the helper processes found so far (one that ended counts no more)."""
        total = 0.0
        for proc in self._children.values():
            try:
                ct = proc.cpu_times()
            except psutil.Error:
                continue
            total += ct.user + ct.system
        return total


def settle(meter: CpuMeter) -> float:
    """Wait until the process is quiet (:data:`QUIET_SHARE`), at most :data:`SETTLE_MAX_S`;
    return the seconds waited."""
    start = time.perf_counter()
    last = meter.background()
    while time.perf_counter() - start < SETTLE_MAX_S:
        time.sleep(QUIET_WINDOW_S)
        now = meter.background()
        if now - last < QUIET_SHARE * QUIET_WINDOW_S:
            break
        last = now
    return time.perf_counter() - start


def measure(names: list[str], rounds: int, seed: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="rlpulse-caller-"))
    p = Payloads(seed)
    contenders: dict[str, Contender] = {}
    setup_s: dict[str, float] = {}
    for name in names:
        t = time.perf_counter()
        contenders[name] = FACTORIES[name](p, tmp)
        setup_s[name] = time.perf_counter() - t
    exclude = {pid for c in contenders.values() for pid in c.helper_pids}
    meter = CpuMeter(exclude)
    workloads = ["scalars60", "tensors20"]
    samples: dict[tuple[str, str], list[float]] = {(n, w): [] for n in names for w in workloads}
    cpu: dict[tuple[str, str], float] = dict.fromkeys(samples, 0.0)
    steps = dict.fromkeys(names, 0)
    rng = random.Random(seed)
    clock = time.perf_counter_ns
    sleep = time.sleep
    # warm-up: one block each, not recorded
    for name, c in contenders.items():
        for w in workloads:
            for _ in range(10):
                c.log(steps[name], w)
                steps[name] += 1
                sleep(PACE_S)
    sleep(0.5)
    meter.read()  # finds the helper processes settle() watches
    settle(meter)
    settled: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(rounds):
        order = [(n, w) for n in names for w in workloads]
        rng.shuffle(order)
        for name, w in order:
            c = contenders[name]
            out = samples[(name, w)]
            cpu0 = meter.read()
            i = steps[name]
            for _ in range(BLOCK):
                t0 = clock()
                c.log(i, w)
                out.append((clock() - t0) / 1e3)
                i += 1
                sleep(PACE_S)
            steps[name] = i
            sleep(PAUSE_S)
            settled[name].append(settle(meter))
            cpu[(name, w)] += meter.read() - cpu0
    close_s: dict[str, float] = {}
    for name, c in contenders.items():
        t = time.perf_counter()
        c.close()
        close_s[name] = time.perf_counter() - t
    results = []
    for (name, w), xs in samples.items():
        stats = summarize(xs)
        results.append(
            {
                "contender": name,
                "workload": w,
                "us": stats,
                "cpu_us_per_call": cpu[(name, w)] / len(xs) * 1e6,
                "samples": xs,
            }
        )
    settle_s = {name: summarize(xs) for name, xs in settled.items()}
    return {"results": results, "setup_s": setup_s, "close_s": close_s, "settle_s": settle_s}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0], "libzmq": zmq.zmq_version()}
    for pkg in (
        "pyzmq",
        "msgpack",
        "numpy",
        "torch",
        "wandb",
        "swanlab",
        "tensorboard",
        "prometheus_client",
        "psutil",
    ):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30, help="blocks of 50 calls per contender")
    parser.add_argument("--contenders", default=",".join(FACTORIES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="caller_cost")
    args = parser.parse_args()
    # Nothing may reach the network: offline modes, and (run.py) a loopback-only namespace.
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("SWANLAB_MODE", "offline")
    steal = CpuSteal()
    load0 = load_snapshot()
    res = measure(args.contenders.split(","), args.rounds, args.seed)
    res.update(
        load_start=load0,
        load_end=load_snapshot(),
        cpu=steal.since_start(),
        versions=versions(),
        block=BLOCK,
        pace_ms=PACE_S * 1e3,
        rounds=args.rounds,
    )
    for r in res["results"]:
        s = r["us"]
        print(
            f"{r['contender']:12s} {r['workload']:10s} median {s['median']:9.1f} us  "
            f"p99 {s['p99']:9.1f} us  max {s['max']:10.1f} us  CPU/call {r['cpu_us_per_call']:8.1f} us",
            flush=True,
        )
    write_json(args.out, res)


if __name__ == "__main__":
    main()
