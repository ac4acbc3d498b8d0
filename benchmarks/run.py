"""``make bench``: run every benchmark, then write ``benchmarks/RESULTS.md`` and the plots.

Each benchmark runs in its own process, inside a loopback-only network namespace when this
runs as root (nothing can reach the network: wandb and swanlab run offline anyway, and the
trainer's Ray probes cloud metadata at start-up). Raw results land in
``benchmarks/results/*.json``; the log of the run in ``benchmarks/results/run.log``.

    python -m benchmarks.run            # everything, under 15 minutes
    python -m benchmarks.run --only latency,report
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import RESULTS, CpuSteal, load_snapshot, write_json

ROOT = Path(__file__).resolve().parent.parent
NETNS = ["unshare", "-n", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
BENCHES: dict[str, tuple[list[str], int]] = {
    # name: (arguments, timeout in seconds)
    "caller_cost": (["--rounds", "20"], 420),
    "ingest": ([], 600),
    "paced": ([], 420),
    "latency": ([], 300),
    "tiers": ([], 420),
    "overhead": ([], 420),
    "faults": ([], 180),
    "reduce_cost": ([], 600),
    "serve_load": ([], 300),
    "rl_insight": ([], 300),
    "sketch_cost": (["--calls", "30"], 300),
    "samples_cost": (["--rounds", "10"], 180),
    "ledger_cost": ([], 300),
}


def _netns_works() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run([*NETNS, "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


def _machine() -> str:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        mem = f"{psutil.virtual_memory().total / 2**30:.1f} GiB RAM"
    except ImportError:
        mem = "? RAM"
    return f"{os.cpu_count()} CPUs ({model}), {mem}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def _git() -> str:
    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = [
        line[3:]
        for line in git(
            "status", "--porcelain", "--", "producer", "collector", "schemas", "trainer"
        ).splitlines()
    ]
    if not dirty:
        return f"git {rev}, clean"
    return f"git {rev} plus uncommitted changes to {len(dirty)} files under producer/ collector/ schemas/ trainer/ (work in progress benchmarked as it stood)"


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    import zmq

    parts = [f"libzmq {zmq.zmq_version()}"]
    for pkg in (
        "rlpulse",
        "pyzmq",
        "msgpack",
        "numpy",
        "torch",
        "wandb",
        "swanlab",
        "tensorboard",
        "prometheus_client",
        "ray",
        "rl-insight",
    ):
        try:
            parts.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            parts.append(f"{pkg} not installed")
    return ", ".join(parts)


def run_one(name: str, args: list[str], timeout: int, netns: bool, log) -> bool:
    cmd = [sys.executable, "-m", f"benchmarks.{name}", *args]
    if netns:
        cmd = NETNS + cmd
    print(f"== {name}: {' '.join(args) or '(defaults)'}", flush=True)
    log.write(f"\n== {name} {dt.datetime.now().isoformat(timespec='seconds')}: {' '.join(cmd)}\n")
    log.flush()
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if not line.startswith("swanlab"):
                print("   " + line.rstrip(), flush=True)
        proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - t)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        print(f"   {name}: timed out after {timeout} s", flush=True)
        return False
    ok = proc.returncode == 0
    print(
        f"   {name}: {'done' if ok else f'FAILED (exit {proc.returncode})'} in {time.perf_counter() - t:.0f} s",
        flush=True,
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", default="", help=f"comma-separated subset of {', '.join(BENCHES)}, report"
    )
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    RESULTS.mkdir(parents=True, exist_ok=True)
    netns = _netns_works()
    start = time.perf_counter()
    load0 = load_snapshot()
    steal = CpuSteal()
    failed = []
    with (RESULTS / "run.log").open("w") as log:
        for name, (bargs, timeout) in BENCHES.items():
            if only and name not in only:
                continue
            if not run_one(name, bargs, timeout, netns, log):
                failed.append(name)
                (RESULTS / f"{name}.json").unlink(missing_ok=True)
    load1 = load_snapshot()
    cpu = steal.since_start()
    if not only or only - {"report"}:
        write_json(
            "run",
            {
                "date": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
                "command": "python -m benchmarks.run" + (f" --only {args.only}" if only else ""),
                "duration_s": time.perf_counter() - start,
                "machine": _machine(),
                "load": (
                    f"load average (1 min) {load0['load1']:.1f} at the start and {load1['load1']:.1f} at the end "
                    f"on {os.cpu_count()} CPUs (other engineers share the machine); over the run the machine was "
                    f"{cpu['busy']:.0%} busy and the hypervisor stole {cpu['steal']:.1%} of CPU time"
                ),
                "versions": _versions(),
                "git": _git() + ("" if netns else "; not run in a network namespace (needs root)"),
                "failed": failed,
            },
        )
    from benchmarks.report import render

    print(f"wrote {render()}", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)} (see {RESULTS / 'run.log'})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
