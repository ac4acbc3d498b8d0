"""The checks behind ``scripts/gpu-check.sh``: rlpulse's GPU promises, measured on a GPU.

``python scripts/gpu_check.py all --out DIR`` runs each check below in a process of its own
under a time limit, writes ``DIR/gpu-check.json`` (every row and each check's details) and
prints the summary last, a row per goal, met or not met. Each check is also a subcommand
(``tests``, ``merge``, ``nvml``, ``bench``, ``trainer``) that prints its rows as one JSON
line; ``merge --device cpu`` runs here too (``tests/test_gpu_check.py``).

* ``tests``: every ``gpu``-marked test; the code under test runs under
  ``torch.cuda.set_sync_debug_mode("error")`` (any synchronizing CUDA call raises), the
  sender thread's work included.
* ``merge``: two producer processes log CUDA tensors of every dtype ``log()`` takes, plain and
  masked, to a real collector; the merged values equal a float64 reduction of the same values,
  and a distribution's quantiles are within the sketch's 1% of the exact ones.
* ``nvml``: NVML's ``memory_used``, ``memory_total`` and ``memory_process`` against
  ``nvidia-smi`` and ``torch.cuda``.
* ``bench``: the GPU rows of ``benchmarks.reduce_cost`` and ``benchmarks.sketch_cost``.
* ``trainer``: a 3-step run of the real trainer on Ray (actor, critic, reference on CUDA; HF
  rollout), every catalog metric written (``tests/integration/test_trainer_catalog.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from rlpulse.schemas import metrics as M  # noqa: E402  (after the checkout is on the path)

Row = dict[str, Any]
RESULTS_FILE = "gpu-check.json"
LIMITS_S = {"tests": 100, "merge": 60, "nvml": 40, "bench": 100, "trainer": 170}
"""Each check's time limit; together within the 8 minutes the check may take (most finish
far sooner)."""
DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool")
"""What ``log()`` takes from a GPU (docs/producer.md, "On a GPU")."""
CATALOG_STEPS = 3
MERGE_STEPS = 2
DIST = M.CRITIC_ADVANTAGES.name
"""A catalog distribution (``Reduction.DIST``, reported with p50, p90 and p99)."""
MIB = 1024 * 1024


def row(check: str, goal: str, measured: str, met: bool) -> Row:
    return {"check": check, "goal": goal, "measured": measured, "met": bool(met)}


def emit(rows: list[Row], **details: Any) -> None:
    print(json.dumps({"rows": rows, "details": details}, default=str), flush=True)


# ---------------------------------------------------------------------------- tests


def gpu_test_files() -> list[str]:
    """The test files that hold ``gpu``-marked tests (the whole suite would need every
    tracker; these need only what the GPU machine has and the stage brings)."""
    files = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if "frameworks" in path.parts:  # verl and TRL: their own environment
            continue
        if "pytest.mark.gpu" in path.read_text():
            files.append(str(path.relative_to(REPO)))
    return files


def junit_counts(xml: Path) -> tuple[dict[str, int], list[str], list[str]]:
    """pytest's JUnit XML: the counts, the failed tests, and each skipped test with its reason."""
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed: list[str] = []
    skipped: list[str] = []
    if xml.exists():
        root = ET.parse(xml).getroot()
        for suite in root.iter("testsuite"):
            for key in counts:
                counts[key] += int(suite.get(key, 0))
        for case in root.iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            skip = case.find("skipped")
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(name)
            elif skip is not None:
                skipped.append(f"{name}: {skip.get('message')}")
    return counts, failed, skipped


def check_tests(out: Path) -> None:
    files = gpu_test_files()
    xml = out / "gpu-tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
    cmd += ["--continue-on-collection-errors", f"--junitxml={xml}", *files]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    counts, failed, skipped = junit_counts(xml)
    bad = counts["failures"] + counts["errors"]
    passed = counts["tests"] - bad - counts["skipped"]
    measured = f"{passed} passed, {bad} failed, {counts['skipped']} skipped ({len(files)} files)"
    if failed:
        measured += "; failed: " + ", ".join(n.rsplit("::", 1)[-1] for n in failed)
    emit(
        [
            row(
                "gpu-marked tests, under sync debug mode 'error'",
                "all pass; none skipped but those needing vLLM (its CUDA wheel does not travel)",
                measured,
                passed > 0 and bad == 0 and all("vllm" in s.lower() for s in skipped),
            )
        ],
        files=files,
        failed=failed,
        skipped=skipped,
        output_tail=proc.stdout[-6000:] + proc.stderr[-3000:],
    )


# ---------------------------------------------------------------------------- merge

PRODUCER = """
import sys, torch
from rlpulse.producer import Masked, Producer
from rlpulse.producer.config import ProducerConfig
sys.path.insert(0, {repo!r})
from scripts.gpu_check import DIST, merge_values, merge_reductions
address, rank, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]
p = Producer(address, run="gpu-check", role="actor_train", rank=rank, world_size=2,
             reductions=merge_reductions(), config=ProducerConfig(gpu_sample_s=0))
if device == "cuda":
    torch.cuda.set_sync_debug_mode("error")
for step in range({steps}):
    data = {{}}
    for name, (values, mask) in merge_values(rank, step, device).items():
        for stat in ("mean", "max", "min", "sum"):
            data[f"{{name}}/{{stat}}"] = values if mask is None else Masked(values, mask)
    data[DIST] = merge_values(rank, step, device)["check/float32"][0]
    p.log(data, step=step)
p.close(timeout=30)
if device == "cuda":
    torch.cuda.set_sync_debug_mode("default")
s = p.stats()
print("STATS", s["errors"], s["invalid"], s["dropped_send"], flush=True)
"""


def merge_reductions() -> dict[str, str]:
    """The merge rule of every name the merge check logs (declared, not guessed)."""
    out: dict[str, str] = {}
    for dtype in DTYPES:
        for masked in ("", "_masked"):
            for stat in ("mean", "max", "min", "sum"):
                out[f"check/{dtype}{masked}/{stat}"] = stat
    return out


def merge_values(rank: int, step: int, device: str) -> dict[str, tuple[Any, Any]]:
    """The tensors rank ``rank`` logs at ``step``: every dtype, plain and masked, of a size
    that differs by rank (ranks must be pooled, not averaged), made by a seeded generator so
    the checking process makes the same ones."""
    import torch

    n = 1000 + 250_000 * rank + 17 * step
    gen = torch.Generator(device=device).manual_seed(1000 * rank + step)
    base = torch.randn(n, device=device, generator=gen) * 50 + 3 * rank
    mask = torch.rand(n, device=device, generator=gen) < 0.6
    out: dict[str, tuple[Any, Any]] = {}
    for dtype in DTYPES:
        t = base > 0 if dtype == "bool" else base.to(getattr(torch, dtype))
        if dtype == "uint8":
            t = base.abs().to(torch.uint8)
        out[f"check/{dtype}"] = (t, None)
        out[f"check/{dtype}_masked"] = (t, mask)
    return out


def exact(parts: list[tuple[Any, Any]]) -> dict[str, float]:
    """Mean, max, min and sum of the pooled samples in float64."""
    import numpy as np

    pooled = []
    for values, mask in parts:
        v = values.detach().cpu().double().numpy()
        pooled.append(v if mask is None else v[mask.cpu().numpy()])
    a = np.concatenate(pooled)
    return {"mean": a.mean(), "max": a.max(), "min": a.min(), "sum": a.sum()}


def check_merge(out: Path, device: str) -> None:
    import torch

    from rlpulse.collector.launch import start_collector

    if device == "cuda" and not torch.cuda.is_available():
        emit([row("merge", "CUDA", "no CUDA device", False)])
        return
    jsonl = out / "merge.jsonl"
    handle = start_collector(
        {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(jsonl)}}},
        stdout=subprocess.DEVNULL,
        stderr=(out / "merge-collector.log").open("w"),
    )
    script = PRODUCER.format(repo=str(REPO), steps=MERGE_STEPS)
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", script, handle.address, str(rank), device],
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in (0, 1)
        ]
        outputs = [p.communicate(timeout=LIMITS_S["merge"] - 20) for p in procs]
    finally:
        handle.stop()
    producer_ok = all(
        p.returncode == 0 and "STATS 0 0 0" in o for p, (o, _) in zip(procs, outputs, strict=True)
    )
    records = {r["step"]: r for r in map(json.loads, jsonl.read_text().splitlines())}
    wrong, worst, dist_err = compare(records, device)
    complete = all(not records.get(s, {}).get("partial", True) for s in range(MERGE_STEPS))
    n_values = len(DTYPES) * 2 * 4 * MERGE_STEPS
    emit(
        [
            row(
                f"two producers, {device} tensors of {len(DTYPES)} dtypes, plain and masked, "
                "merged by a collector",
                "equal to a float64 reduction (relative 1e-9), steps complete, no producer loss",
                f"{n_values - len(wrong)} of {n_values} values equal (worst relative error "
                f"{worst:.1e}); complete: {complete}; producers clean: {producer_ok}",
                not wrong and complete and producer_ok,
            ),
            row(
                f"distribution (quantile sketch) of {device} float32, merged over 2 ranks",
                "p50, p90, p99 within 1% of the exact quantiles",
                f"worst relative error {dist_err:.2%}",
                dist_err <= 0.01,
            ),
        ],
        wrong=wrong[:20],
        producers=[
            {"rc": p.returncode, "stdout": o[-2000:], "stderr": e[-3000:]}
            for p, (o, e) in zip(procs, outputs, strict=True)
        ],
    )


def compare(records: dict[int, dict[str, Any]], device: str) -> tuple[list[str], float, float]:
    """The merge check's verdict on the collector's records: the values that differ from a
    float64 reduction of both ranks' samples, the worst relative error of the rest, and the
    worst relative error of the distribution's quantiles."""
    import numpy as np

    worst, wrong = 0.0, []
    dist_err = 0.0
    for step in range(MERGE_STEPS):
        rec = records.get(step, {"metrics": {}, "partial": True, "ranks": 0})
        values = [merge_values(rank, step, device) for rank in (0, 1)]
        for name in values[0]:
            want = exact([values[0][name], values[1][name]])
            for stat, w in want.items():
                got = rec["metrics"].get(f"{name}/{stat}", math.nan)
                err = abs(got - w) / max(abs(w), 1e-12) if w != 0 else abs(got)
                worst = max(worst, err if math.isfinite(err) else math.inf)
                if not err <= 1e-9:
                    wrong.append(f"step {step} {name}/{stat}: {got} != {w}")
        pooled = np.concatenate(
            [values[r]["check/float32"][0].cpu().double().numpy() for r in (0, 1)]
        )
        for q in (50, 90, 99):
            got = rec["metrics"].get(f"{DIST}/p{q}", math.nan)
            w = float(np.quantile(pooled, q / 100))
            dist_err = max(dist_err, abs(got - w) / abs(w) if math.isfinite(got) else math.inf)
    return wrong, worst, dist_err


# ---------------------------------------------------------------------------- nvml


def _smi(query: str, kind: str = "gpu") -> list[list[str]]:
    flag = "--query-gpu" if kind == "gpu" else "--query-compute-apps"
    out = subprocess.run(
        ["nvidia-smi", f"{flag}={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line]


def check_nvml(out: Path) -> None:
    import torch

    from rlpulse.producer.gpustate import GIB, NvmlSampler

    keep = torch.empty(1024 * MIB, dtype=torch.uint8, device="cuda")
    keep.fill_(1)
    torch.cuda.synchronize()
    sampler = NvmlSampler("gpu_check")
    if not sampler.start():
        emit([row("NVML", "readable", f"off: {sampler.off_reason}", False)])
        return
    readings = sampler.sample()
    smi = _smi("index,memory.used,memory.total")
    apps = _smi("pid,used_memory", kind="apps")
    sampler.close()
    dev = torch.cuda.current_device()
    name = lambda stat: M.GPU_DEVICE_MEMORY.format(  # noqa: E731
        cluster="gpu_check", device_id=dev, stat=stat
    )
    used, total = readings.get(name("memory_used")), readings.get(name("memory_total"))
    own = readings.get(name("memory_process"))
    smi_used, smi_total = (float(smi[dev][1]) / 1024, float(smi[dev][2]) / 1024)  # MiB -> GiB
    smi_own = [float(a[1]) / 1024 for a in apps if a and a[0] == str(os.getpid())]
    reserved = torch.cuda.memory_reserved(dev) / GIB
    tol = 64 / 1024  # GiB: other processes may allocate between the two readings
    rows = [
        row(
            "NVML memory_used against nvidia-smi memory.used",
            "within 64 MiB",
            f"{used:.3f} GiB vs {smi_used:.3f} GiB" if used is not None else "absent",
            used is not None and abs(used - smi_used) <= tol,
        ),
        row(
            "NVML memory_total against nvidia-smi memory.total",
            "within 64 MiB",
            f"{total:.3f} GiB vs {smi_total:.3f} GiB" if total is not None else "absent",
            total is not None and abs(total - smi_total) <= tol,
        ),
        row(
            "NVML memory_used against torch.cuda.memory_reserved",
            ">= reserved (the driver sees the allocator's memory and the context)",
            f"{used:.3f} GiB vs {reserved:.3f} GiB" if used is not None else "absent",
            used is not None and used >= reserved,
        ),
    ]
    if own is None:
        rows.append(
            row(
                "NVML memory_process (this process)",
                ">= torch reserved, equal to nvidia-smi's process row",
                "absent: NVML lists no process of ours (a PID namespace hides it); "
                f"nvidia-smi lists {len(apps)} process(es)",
                not smi_own,  # met only where nvidia-smi does not see us either
            )
        )
    else:
        smi_text = f"{smi_own[0]:.3f} GiB" if smi_own else "not listed by nvidia-smi"
        rows.append(
            row(
                "NVML memory_process (this process)",
                ">= torch reserved, within 64 MiB of nvidia-smi's process row",
                f"{own:.3f} GiB; torch reserved {reserved:.3f} GiB; nvidia-smi {smi_text}",
                own >= reserved and (not smi_own or abs(own - smi_own[0]) <= tol),
            )
        )
    emit(rows, readings=readings, smi=smi, apps=apps, pid=os.getpid())
    del keep


# ---------------------------------------------------------------------------- bench


def check_bench(out: Path, calls: int) -> None:
    import torch

    from benchmarks import reduce_cost, sketch_cost

    with tempfile.TemporaryDirectory() as d:
        gpu = reduce_cost.gpu_section(calls, Path(d))
    rows = []
    res = gpu["results"]
    for n in (1000, reduce_cost.N):
        naive = res["idle"][n]["naive_mean_item"]["median"]
        for kind in ("log", "log_masked"):
            idle = res["idle"][n][kind]["median"]
            busy = res["busy"][n][kind]["median"]
            label = f"log() of a {n:,}-element CUDA tensor{' (Masked)' if 'masked' in kind else ''}"
            rows.append(
                row(
                    f"{label}, GPU idle",
                    f"<= a naive .mean().item() ({naive:.1f} µs)",
                    f"{idle:.1f} µs median ({idle / naive:.2f}x)",
                    idle <= naive,
                )
            )
            rows.append(
                row(
                    f"{label}, 200 ms of GPU work queued",
                    "<= 100 µs median (no waiting)",
                    f"{busy:.1f} µs median",
                    busy <= 100,
                )
            )
    phase = gpu["phase"]
    gpu_exec, host_exec, work = phase["gpu_execute_s"], phase["host_execute_s"], phase["work_s"]
    rows.append(
        row(
            "a phase that queues 300 ms of kernels",
            ">= 300 ms of GPU execute time, within 5 ms above the work's own events",
            f"GPU {gpu_exec * 1e3:.1f} ms (the work's events: {work * 1e3:.1f} ms), "
            f"host {host_exec * 1e3:.1f} ms",
            gpu_exec >= 0.3 and work <= gpu_exec <= work + 0.005,
        )
    )
    sketch = sketch_cost.gpu_rows(calls)
    rows.append(
        row(
            "quantile sketch on the side stream, 1M float32 masked",
            "measured (device and host launch time)",
            "; ".join(sketch),
            all("not measured" not in s for s in sketch),
        )
    )
    emit(
        rows,
        reduce_cost=gpu["results"],
        reduce_cost_markdown=gpu["markdown"],
        sketch_rows=sketch,
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
    )


# ---------------------------------------------------------------------------- trainer


def check_trainer(out: Path) -> None:
    xml = out / "trainer.xml"
    env = {**os.environ, "RLPULSE_CATALOG_STEPS": str(CATALOG_STEPS)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"]
    cmd += ["tests/integration/test_trainer_catalog.py"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    counts, failed, skipped = junit_counts(xml)
    bad = counts["failures"] + counts["errors"]
    passed = counts["tests"] - bad - counts["skipped"]
    emit(
        [
            row(
                f"a {CATALOG_STEPS}-step trainer run on Ray, actor and critic on CUDA "
                "(tests/integration/test_trainer_catalog.py)",
                "every catalog metric written (GPU memory included), steps complete, values "
                "coherent; skipped only the vLLM engine's checks (its CUDA wheel does not travel)",
                f"{passed} passed, {bad} failed, {counts['skipped']} skipped",
                passed > 0 and bad == 0 and all("vllm" in x.lower() for x in skipped),
            )
        ],
        failed=failed,
        skipped=skipped,
        output_tail=proc.stdout[-8000:] + proc.stderr[-4000:],
    )


# ---------------------------------------------------------------------------- all


def run_check(name: str, out: Path, extra: list[str]) -> tuple[list[Row], dict[str, Any], float]:
    """Run one check in a process of its own, within its limit."""
    start = time.monotonic()
    cmd = [sys.executable, str(Path(__file__)), name, "--out", str(out), *extra]
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, capture_output=True, text=True, timeout=LIMITS_S[name], check=False
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-3000:] if isinstance(exc.stdout, bytes) else str(exc.stdout)
        return (
            [row(name, f"finishes within {LIMITS_S[name]} s", "timed out", False)],
            {"output_tail": tail},
            time.monotonic() - start,
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"rows"')]
    if proc.returncode != 0 or not lines:
        return (
            [row(name, "runs", f"failed (exit {proc.returncode})", False)],
            {"output_tail": proc.stdout[-4000:] + proc.stderr[-6000:]},
            time.monotonic() - start,
        )
    result = json.loads(lines[-1])
    return result["rows"], result["details"], time.monotonic() - start


def check_all(out: Path, calls: int, only: list[str] | None = None) -> int:
    import torch

    started = time.time()
    header = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
    }
    try:
        header["nvidia_smi"] = _smi("name,driver_version,memory.total")
    except (OSError, subprocess.CalledProcessError) as exc:
        header["nvidia_smi"] = f"unavailable: {exc}"
    print(f"gpu-check: {header['device']}, torch {header['torch']} (CUDA {header['cuda']})")
    checks: dict[str, Any] = {}
    rows: list[Row] = []
    for name, extra in (
        ("tests", []),
        ("merge", ["--device", "cuda"]),
        ("nvml", []),
        ("bench", ["--calls", str(calls)]),
        ("trainer", []),
    ):
        if only and name not in only:
            continue
        got, details, seconds = run_check(name, out, extra)
        checks[name] = {"rows": got, "details": details, "seconds": round(seconds, 1)}
        rows += got
        met = sum(r["met"] for r in got)
        print(f"gpu-check: {name}: {met} of {len(got)} met ({seconds:.0f} s)", flush=True)
        (out / RESULTS_FILE).write_text(
            json.dumps({**header, "rows": rows, "checks": checks}, indent=1, default=str)
        )
    header["seconds"] = round(time.time() - started, 1)
    (out / RESULTS_FILE).write_text(
        json.dumps({**header, "rows": rows, "checks": checks}, indent=1, default=str)
    )
    print()
    print(f"## GPU check: {header['device']}, torch {header['torch']}, {header['started']}")
    print()
    print("| check | goal | measured | verdict |")
    print("|---|---|---|---|")
    for r in rows:
        verdict = "met" if r["met"] else "**not met**"
        print(f"| {r['check']} | {r['goal']} | {r['measured']} | {verdict} |")
    failed = sum(not r["met"] for r in rows)
    print()
    print(
        f"gpu-check: {len(rows) - failed} of {len(rows)} met in {header['seconds']:.0f} s; "
        f"results in {out / RESULTS_FILE}"
    )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=["all", *LIMITS_S])
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "gpu-check")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument(
        "--only", action="append", choices=list(LIMITS_S), help="with all: run only these"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.check == "all":
        return check_all(args.out, args.calls, args.only)
    if args.check == "tests":
        check_tests(args.out)
    elif args.check == "merge":
        check_merge(args.out, args.device)
    elif args.check == "nvml":
        check_nvml(args.out)
    elif args.check == "bench":
        check_bench(args.out, args.calls)
    else:
        check_trainer(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
