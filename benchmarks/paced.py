"""The collector's cost at training pace (issue 24): one message per rank per ``log()``.

A training job does not flood its collector: each rank sends one message per ``log()`` call,
a step or a phase at a time. Here simulated ranks (``benchmarks.wire``: the real wire
encoding, a 60-name table declared in the hello) send one 60-value message per rank per step
at a fixed pace, and we read the collector process's own CPU time (``/proc``, through psutil)
over the paced window, divided by the messages it took: CPU per message and per value. The
floor is the same messages, paced the same way, into a bare ZeroMQ ROUTER socket that
receives and msgpack-decodes each one and does nothing else. Ratio = floor / collector (1.0:
the collector costs no more than receiving and decoding; the goal is >= 0.5).

The same messages are also taken *warm* (:func:`run_warm`): queued on the socket first, then
received and handled back to back, in the batches a paced collector takes them in (the
messages of one ``SETTLE_S`` window, then a settle), with no sleep between; and the floor's
receive and decode likewise. Warm is the work a message itself costs; paced minus warm is
what waking from idle costs on this machine, for the floor and the collector alike.

Shapes: 16 ranks at 250 steps/s, 256 ranks at 16 steps/s and 1,024 ranks at 4 steps/s:
about 4,000 messages a second each, far below saturation on this machine, so what is measured
is the work per message, not queueing. A trainer sends several messages per rank per step
(a step's values, phase ends, GPU state): :func:`messages_per_rank_step` reads that mix from
a real ``rlpulse train`` run's collector, and the scale estimate uses it.

    python -m benchmarks.paced            # every shape, results/paced.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import subprocess
import time
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

import msgpack
import psutil
import zmq

from benchmarks import wire
from benchmarks.common import free_port, median, write_json
from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.daemon import BATCH, SETTLE_S, Collector
from rlpulse.collector.launch import start_collector

SPAWN = mp.get_context("spawn")
METRICS = 60
SHAPES = ((16, 250.0), (256, 16.0), (1024, 4.0))
"""(ranks, steps per second): about 4,000 messages a second each."""
FASTER = ((256, 64.0), (256, 128.0))
"""256 ranks at 4x and 8x the pace: how much of a message's cost comes with each wake-up
(spread over more messages at a faster pace) rather than with the message. Apart from the
goal rows."""
SECONDS = 6.0
ROLE = "actor_train"


def _sender(address: str, ranks: int, rate: float, steps: int, ready: Any, go: Any) -> None:
    """Register ``ranks`` simulated ranks, then send one message per rank per step, a step
    every ``1 / rate`` seconds (the ranks of a step spread over the step's interval, as
    ranks finish their ``log()`` at slightly different times)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(address)
    sims = wire.sim_ranks(range(ranks), seed=int(time.time()))
    shape = wire.Shape(wire.metric_names(METRICS))
    for sim in sims:
        sock.send(sim.hello("paced", ROLE, ranks, shape))
    ready.set()
    go.wait()
    interval = 1.0 / rate
    gap = interval / ranks
    start = time.perf_counter()
    for step in range(steps):
        t = time.time()
        for i, sim in enumerate(sims):
            due = start + step * interval + i * gap
            wait = due - time.perf_counter()
            if wait > 0.0005:
                time.sleep(wait)
            sock.send(sim.metrics(shape, step, t))
    for sim in sims:
        sock.send(sim.bye())
    time.sleep(1.0)
    sock.close()
    ctx.term()


def _floor(ready_file: str, expect: int, hellos: int, out: Any) -> None:
    """Receive and msgpack-decode every message on a bare ROUTER socket; ``out``: CPU
    seconds from the first data message to the last."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.bind("tcp://127.0.0.1:*")
    Path(ready_file).write_text(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    recv, unpackb = sock.recv, msgpack.unpackb
    cpu0 = 0.0
    for count in range(1, expect + 1):
        recv()  # the peer's identity
        unpackb(recv(), raw=False)
        if count == hellos:
            cpu0 = time.process_time()
    out[0] = time.process_time() - cpu0
    sock.close(linger=0)
    ctx.term()


def _senders(address: str, ranks: int, rate: float, steps: int) -> tuple[Any, Any, Any]:
    ready, go = SPAWN.Event(), SPAWN.Event()
    proc = SPAWN.Process(target=_sender, args=(address, ranks, rate, steps, ready, go))
    proc.start()
    if not ready.wait(120):
        raise RuntimeError("the sender did not start")
    return proc, ready, go


def run_floor(ranks: int, rate: float, steps: int) -> float:
    """CPU seconds per message of the floor."""
    tmp = Path(mkdtemp(prefix="rlpulse-paced-floor-"))
    out = SPAWN.Array("d", 1)
    messages = ranks * steps
    floor = SPAWN.Process(
        target=_floor, args=(str(tmp / "addr"), ranks + messages + ranks, ranks, out)
    )
    floor.start()
    while not (tmp / "addr").exists():
        time.sleep(0.01)
    time.sleep(0.05)
    proc, _, go = _senders((tmp / "addr").read_text(), ranks, rate, steps)
    time.sleep(0.5)  # the hellos are in
    go.set()
    proc.join(600)
    floor.join(60)
    return out[0] / messages


def run_collector(ranks: int, rate: float, steps: int) -> dict[str, float]:
    """CPU seconds per message of the real collector (jsonl sink), every step checked."""
    tmp = Path(mkdtemp(prefix="rlpulse-paced-"))
    out = tmp / "out.jsonl"
    config = {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}},
        "settle_s": 0,
        "grace_s": 60,
    }
    bind = f"tcp://127.0.0.1:{free_port()}"
    collector = start_collector(
        config, bind=bind, stderr=(tmp / "collector.log").open("w"), stdout=subprocess.DEVNULL
    )
    try:
        proc, _, go = _senders(bind, ranks, rate, steps)
        time.sleep(1.0)  # the hellos are applied
        ps = psutil.Process(collector.proc.pid)
        cpu0 = sum(ps.cpu_times()[:2])
        wall0 = time.perf_counter()
        go.set()
        deadline = time.monotonic() + 600
        while _lines(out) < steps and time.monotonic() < deadline:
            time.sleep(0.01)
        cpu = sum(ps.cpu_times()[:2]) - cpu0
        wall = time.perf_counter() - wall0
        proc.join(60)
    finally:
        assert collector.stop() == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(steps)), "every step, once, in order"
    assert not any(r["partial"] for r in records), "no step partial"
    messages = ranks * steps
    return {"cpu_per_message": cpu / messages, "wall_s": wall, "messages": messages}


def _warm(ranks: int, rate: float, steps: int, out: Any) -> None:
    """:func:`run_warm` in a fresh process: ``out`` gets the floor's and the collector's
    CPU seconds per message."""
    sims = wire.sim_ranks(range(ranks), seed=int(time.time()))
    shape = wire.Shape(wire.metric_names(METRICS))
    t = time.time()
    hellos = [sim.hello("paced", ROLE, ranks, shape) for sim in sims]
    data = [sim.metrics(shape, step, t) for step in range(steps) for sim in sims]
    data += [sim.bye() for sim in sims]
    ctx = zmq.Context()
    senders: dict[str, zmq.Socket] = {}

    def queue(address: str, messages: list[bytes], settled: Any) -> None:
        sender = senders.get(address)
        if sender is None:
            sender = senders[address] = ctx.socket(zmq.DEALER)
            sender.setsockopt(zmq.SNDHWM, 0)
            sender.connect(address)
        for raw in messages:
            sender.send(raw)
        settled()

    # The floor: every message queued on a bare ROUTER, then received and decoded back to back.
    floor = ctx.socket(zmq.ROUTER)
    floor.setsockopt(zmq.RCVHWM, 0)
    floor.bind("tcp://127.0.0.1:*")
    queue(floor.getsockopt_string(zmq.LAST_ENDPOINT), data, lambda: time.sleep(1.0))
    recv, unpackb = floor.recv, msgpack.unpackb
    cpu0 = time.process_time()
    for _ in data:
        recv()
        unpackb(recv(), raw=False)
    out[0] = (time.process_time() - cpu0) / len(data)
    floor.close(linger=0)

    # The collector: registered first, then the same messages taken as a paced run takes
    # them (a window's worth, then a settle: Collector.run's loop without its sleep).
    tmp = Path(mkdtemp(prefix="rlpulse-paced-warm-"))
    jsonl = tmp / "out.jsonl"
    collector = Collector(
        CollectorConfig.from_mapping(
            {
                "bind": f"tcp://127.0.0.1:{free_port()}",
                "track_with": ["jsonl"],
                "tracker_kwargs": {"jsonl": {"path": str(jsonl)}},
                "settle_s": 0,
                "grace_s": 60,
            }
        )
    )
    collector.fanout.start()
    health = collector.health

    def take(total: int, window: int) -> None:
        while health.messages_received < total:
            collector._receive(window)
            collector._settle()

    queue(collector.address, hellos, lambda: take(ranks, BATCH))
    queue(collector.address, data, lambda: time.sleep(1.0))
    window = max(1, round(ranks * rate * SETTLE_S))
    cpu0 = time.process_time()
    take(ranks + len(data), window)
    while _lines(jsonl) < steps:  # the sink's writing counts too, as in the paced run
        time.sleep(0.001)
    out[1] = (time.process_time() - cpu0) / len(data)
    collector.close()
    for sender in senders.values():
        sender.close(linger=0)
    ctx.term()
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(steps)), "every step, once, in order"
    assert not any(r["partial"] for r in records), "no step partial"


WARM_MESSAGES = 25_000
"""At most this many messages are queued for a warm run: well under the collector's receive
bound (``RCVHWM``), so all of them are on its side of the socket before the clock starts
(beyond it, the rest would still cross from the sender, in this process, while timed)."""


def run_warm(ranks: int, rate: float, steps: int) -> tuple[float, float]:
    """CPU seconds per message, the floor's and the collector's, with the machine warm: the
    messages of :func:`run_collector` (up to :data:`WARM_MESSAGES`) queued first, then taken
    back to back."""
    steps = max(2, min(steps, WARM_MESSAGES // ranks))
    out = SPAWN.Array("d", 2)
    proc = SPAWN.Process(target=_warm, args=(ranks, rate, steps, out))
    proc.start()
    proc.join(600)
    if proc.exitcode != 0:
        raise RuntimeError(f"the warm run failed (exit code {proc.exitcode})")
    return out[0], out[1]


def _lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def messages_per_rank_step(log: Path) -> float | None:
    """From a trainer run's collector log: messages received per producer per step."""
    text = log.read_text() if log.exists() else ""
    stop = [line for line in text.splitlines() if "collector stopped:" in line]
    registered = sum(1 for line in text.splitlines() if " registered (host " in line)
    if not stop or not registered:
        return None
    words = stop[-1].split("collector stopped:")[1].split(",")
    messages = int(words[0].split()[0])
    steps = int(words[1].split()[0])
    return messages / steps / registered


def trainer_mix(steps: int = 3) -> dict[str, float] | None:
    """Messages per rank per step of a real ``rlpulse train`` run (the demo config, its
    collector ours): a step's values, phase ends and GPU state, as a trainer sends them."""
    import sys

    root = Path(__file__).resolve().parent.parent
    tmp = Path(mkdtemp(prefix="rlpulse-paced-mix-"))
    log = tmp / "collector.log"
    bind = f"tcp://127.0.0.1:{free_port()}"
    collector = start_collector(
        {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(tmp / "m.jsonl")}}},
        bind=bind,
        stderr=log.open("w"),
        stdout=subprocess.DEVNULL,
    )
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "rlpulse.trainer",
                "--config",
                str(root / "trainer" / "configs" / "demo.yaml"),
                "--steps",
                str(steps),
                "--collector",
                bind,
                "--run",
                "paced-mix",
                "--no-progress",
                "--set",
                f"output_dir={tmp}",
            ],
            capture_output=True,
            timeout=600,
            check=False,
        )
    finally:
        collector.stop()
    if done.returncode != 0:
        return None
    per = messages_per_rank_step(log)
    return None if per is None else {"messages_per_rank_step": per, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-trainer", action="store_true", help="skip the trainer's mix")
    args = parser.parse_args()
    mix = None if args.no_trainer else trainer_mix()
    print(f"trainer mix: {mix}", flush=True)
    rows, faster = [], []
    for ranks, rate in (*SHAPES, *FASTER):
        steps = max(2, int(rate * args.seconds))
        collector, floor = [], []
        for _ in range(args.rounds):  # interleaved: floor, collector, collector, floor...
            floor.append(run_floor(ranks, rate, steps))
            collector.append(run_collector(ranks, rate, steps)["cpu_per_message"])
        c, f = median(collector), median(floor)
        warm_floor, warm = run_warm(ranks, rate, steps)
        row = {
            "ranks": ranks,
            "steps_per_s": rate,
            "messages_per_s": ranks * rate,
            "values_per_message": METRICS,
            "collector_us_per_message": c * 1e6,
            "collector_values_per_cpu_s": METRICS / c,
            "floor_us_per_message": f * 1e6,
            "ratio": f / c,
            "warm_collector_us_per_message": warm * 1e6,
            "warm_floor_us_per_message": warm_floor * 1e6,
        }
        (rows if (ranks, rate) in SHAPES else faster).append(row)
        print(
            f"{ranks:5d} ranks @ {rate:g} steps/s: collector {c * 1e6:7.1f} us/msg "
            f"({METRICS / c / 1e6:.2f} M values/CPU-s), floor {f * 1e6:6.1f} us/msg, "
            f"ratio {f / c:.2f}; warm: collector {warm * 1e6:.1f}, floor {warm_floor * 1e6:.1f}",
            flush=True,
        )
    write_json(
        "paced",
        {
            "rows": rows,
            "faster": faster,
            "seconds": args.seconds,
            "rounds": args.rounds,
            "mix": mix,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "git": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip(),
        },
    )


if __name__ == "__main__":
    main()
