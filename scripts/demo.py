"""``make demo``: a collector and a real PPO run on Ray, then where to look.

The collector prints each aggregated step (stdout sink) and writes JSON lines, TensorBoard
event files and a Prometheus endpoint; the trainer runs ``trainer/configs/demo.yaml`` against
it. At the end the last Prometheus scrape is saved and the run's curves are drawn. Under
``make demo`` all of it runs in a private network namespace (``scripts/in-netns.sh``), so the
live ``/metrics`` is reached with ``nsenter``, as the demo prints.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import urllib.request
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.health import PRODUCER_DROPPED, PRODUCER_ERRORS, PRODUCER_INVALID
from rlpulse.collector.launch import start_collector
from rlpulse.runtools.cli import main as run_tools
from rlpulse.runtools.compare import RUN_CONFIG
from rlpulse.schemas import Stat, metrics as M
from rlpulse.trainer.__main__ import main as trainer_main

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "trainer" / "configs" / "demo.yaml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, help="PPO steps (the config says 30)")
    args = parser.parse_args()
    cfg = yaml.safe_load(CONFIG.read_text())
    run_dir = ROOT / cfg["output_dir"] / cfg["run"]
    run_dir.mkdir(parents=True, exist_ok=True)
    collector_cfg = CollectorConfig.from_mapping({**cfg["collector"], "settle_s": 0})
    collector_cfg = collector_cfg.placed_under(run_dir)
    jsonl = Path(collector_cfg.trackers["jsonl"]["path"])
    jsonl.unlink(missing_ok=True)  # a fresh demo each time
    prom = collector_cfg.trackers["prometheus"]
    metrics_url = f"http://{prom['host']}:{prom['port']}/metrics"
    # Printed while it runs, so a reader knows where to look before the end.
    print(
        f"rlpulse demo: steps print below; files in {run_dir}\n"
        f"  live /metrics while it runs: {live_metrics_hint(metrics_url)}\n"
        f"  rollout: {rollout_backend()}",
        flush=True,
    )
    with start_collector(collector_cfg) as collector:
        # --resume: this demo's directory, made fresh above, even when an earlier demo ran
        # there (without it the trainer would start a new attempt, runs/demo-2).
        argv = ["--config", str(CONFIG), "--collector", collector.address, "--resume"]
        if args.steps:
            argv += ["--steps", str(args.steps)]
        rc = trainer_main(argv)
        scrape = run_dir / "metrics.prom"
        try:
            scrape.write_bytes(urllib.request.urlopen(metrics_url, timeout=10).read())
        except OSError as exc:
            print(f"could not scrape {metrics_url}: {exc}", file=sys.stderr)
    if rc != 0:
        return rc
    report = run_dir / "report.png"
    run_tools(["report", str(jsonl), "--out", str(report)])
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    score = M.VAL_SCORE.output_names()[Stat.MEAN]
    val = [(r["step"], r["metrics"][score]) for r in records if score in r["metrics"]]
    print("\nrlpulse demo finished.")
    print("  validation score: " + ", ".join(f"step {s}: {v:.3f}" for s, v in val))
    print(f"  every step, pooled across ranks:  {jsonl}")
    print(
        f"  TensorBoard:                      .venv/bin/tensorboard --logdir {run_dir / 'tensorboard'}"
    )
    print(
        f"  last Prometheus scrape:           {run_dir / 'metrics.prom'} "
        "(taken before the demo's collector stopped)"
    )
    print(f"  curves:                           {report}")
    trace = run_dir / "traces" / "demo.trace.json"
    if trace.exists():
        print(
            f"  every rank's phases (timeline):   {trace} (open in https://ui.perfetto.dev), or\n"
            f"    .venv/bin/rlpulse report {jsonl} --timeline 10:13"
        )
    print(f"  configuration it ran with:        {run_dir / RUN_CONFIG}")
    print(
        f"  compare runs:                     .venv/bin/rlpulse compare {jsonl} "
        "OTHER/metrics.jsonl --key ppo.actor_lr"
    )
    exported = sorted(
        run_dir.glob("checkpoint-*/actor"),
        key=lambda p: int(p.parent.name.removeprefix("checkpoint-")),
    )
    if exported:
        policy = exported[-1]
        print(
            f"  serve the policy:                 .venv/bin/rlpulse serve --model {policy} "
            "--port 8000\n"
            "    then ask it:                     curl -s -X POST 127.0.0.1:8000/generate "
            """-d '{"prompt": "abc>", "max_new_tokens": 6, "temperature": 0}'\n"""
            "    (add --collector tcp://HOST:5555 to stream its metrics; see docs/serving.md)"
        )
    return check_producers(scrape)


LOSSES = {
    PRODUCER_ERRORS.name: "log() calls that failed inside rlpulse",
    PRODUCER_DROPPED.name: "log() calls dropped",
    PRODUCER_INVALID.name: "values refused as invalid",
}
"""What the producers reported losing, as the collector's /metrics counts it."""


def check_producers(scrape: Path) -> int:
    """1 if the scrape says a producer's log() failed inside rlpulse (a bug of ours: the demo
    must not pass over it), else 0; drops and invalid values are reported, not failed on."""
    if not scrape.exists():
        return 0
    found = {
        sample.name: sample.value
        for family in text_string_to_metric_families(scrape.read_text())
        for sample in family.samples
        if sample.name in LOSSES
    }
    lost = {name: value for name, value in found.items() if value}
    for name, value in lost.items():
        print(f"  the producers reported {value:.0f} {LOSSES[name]} ({name})", file=sys.stderr)
    return 1 if lost.get(PRODUCER_ERRORS.name) else 0


def private_network_namespace() -> bool:
    """Whether this process runs in another network namespace than the shell that started it
    (``make demo`` runs us through ``scripts/in-netns.sh`` when it can: root and unshare).

    The nearest ancestor in another namespace says so. When an ancestor cannot be seen
    (reparented to init, as under nohup), a namespace with the loopback interface alone is
    taken to be in-netns.sh's."""
    own = _netns(os.getpid())
    pid = os.getppid()
    while own is not None and pid >= 1:
        theirs = _netns(pid)
        if theirs is None:
            break
        if theirs != own:
            return True
        pid = _parent(pid) if pid > 1 else 0
    else:
        return False  # every ancestor shares our namespace (or we cannot see our own)
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:  # not Linux, or not allowed to look
        return None


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rpartition(")")[2].split()[1])  # after "pid (comm)": state, ppid


def rollout_backend() -> str:
    """Which engine the demo's rollouts use, and why (vLLM unless it cannot be imported or
    cannot run the model; never a silent fallback)."""
    import torch

    from rlpulse.trainer.config import load_config
    from rlpulse.trainer.workers.rollout import choose_backend

    backend, why = choose_backend(load_config(CONFIG), on_cpu=not torch.cuda.is_available())
    if backend == "vllm":
        return f"vLLM, the rollout engine ({why}); its metrics are logged as rollout/engine/..."
    return f"HF generate, NOT vLLM: {why}"


def live_metrics_hint(url: str) -> str:
    """Where the live /metrics can be read from, said truthfully: in a private network
    namespace, 127.0.0.1 is the namespace's own loopback, which the user's shell cannot
    reach; nsenter (root, which the namespace needed anyway) enters it."""
    if not private_network_namespace():
        return url
    return (
        f"{url} inside the demo's private network namespace (not reachable from your shell "
        f"as is); from another shell: nsenter --net=/proc/{os.getpid()}/ns/net curl -s {url}"
    )


if __name__ == "__main__":
    sys.exit(main())
