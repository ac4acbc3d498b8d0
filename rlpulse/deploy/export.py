"""``rlpulse deploy export DIR``: the monitoring stack's files, from the installed package.

Writes ``prometheus/`` (``prometheus.yml``, ``rules/``, the rules' promtool tests),
``grafana/`` (dashboards and provisioning), ``collector.yaml``, and ``docker-compose.yml``:
Prometheus and Grafana in containers on the host's network, scraping a collector that runs on
the host (``rlpulse collector --config collector.yaml``). Files already in ``DIR`` are kept
unless ``--force``.

The exported ``prometheus.yml`` scrapes ``--target`` (default ``127.0.0.1:9464``, the
exported collector's ``/metrics``), so it works as it is both under the exported compose file
(host network) and as ``prometheus --config.file=DIR/prometheus/prometheus.yml`` on the host.
The repository's own ``deploy/docker-compose.yml`` keeps its file, which names the compose
service ``collector``.

>>> # rlpulse deploy export monitoring && docker compose -f monitoring/docker-compose.yml up -d
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPORTED = {
    "prometheus/prometheus.yml": "prometheus/prometheus.yml",
    "prometheus/rules": "prometheus/rules",
    "prometheus/tests": "prometheus/tests",
    "grafana/dashboards": "grafana/dashboards",
    "grafana/provisioning": "grafana/provisioning",
    "monitoring-collector.yaml": "collector.yaml",
    "monitoring-compose.yml": "docker-compose.yml",
}
"""What is written: source under the package -> where, under DIR."""
PROMETHEUS_CONFIG = "prometheus/prometheus.yml"
COMPOSE_TARGET = "collector:9464"
"""The collector's ``/metrics`` as the repository's compose file names it."""
DEFAULT_TARGET = "127.0.0.1:9464"
"""Where the exported collector config serves ``/metrics``."""


def prometheus_config(target: str = DEFAULT_TARGET) -> str:
    """The Prometheus config scraping the collector (and its ``/sd``) at ``target``."""
    text = (HERE / PROMETHEUS_CONFIG).read_text().replace(COMPOSE_TARGET, target)
    return (
        f"# Written by `rlpulse deploy export --target {target}`: the collector is scraped at\n"
        f"# {target} (the repository's deploy/docker-compose.yml names it {COMPOSE_TARGET}).\n"
        + text
    )


def _check_target(target: str) -> str:
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in target:
        raise argparse.ArgumentTypeError(f"{target!r}: expected HOST:PORT, e.g. {DEFAULT_TARGET}")
    return target


def files() -> dict[Path, str]:
    """Every file exported: its source, and its path under the target directory."""
    out: dict[Path, str] = {}
    for source, target in EXPORTED.items():
        path = HERE / source
        if path.is_dir():
            for f in sorted(path.rglob("*")):
                if f.is_file() and f.suffix in (".yml", ".yaml", ".json"):
                    out[f] = f"{target}/{f.relative_to(path).as_posix()}"
        else:
            out[path] = target
    return out


def export(directory: Path, force: bool = False, target: str = DEFAULT_TARGET) -> list[Path]:
    """Write the files under ``directory``, Prometheus scraping ``target``; return them.
    Raises ``FileExistsError`` naming a file that exists (unless ``force``)."""
    plan = {source: directory / target for source, target in files().items()}
    if not force:
        clash = [str(p) for p in plan.values() if p.exists()]
        if clash:
            raise FileExistsError(f"{clash[0]} exists ({len(clash)} files would be replaced)")
    for source, path in plan.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if path == directory / PROMETHEUS_CONFIG:
            path.write_text(prometheus_config(target))
        else:
            shutil.copyfile(source, path)
    return sorted(plan.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rlpulse deploy",
        description=__doc__.split("\n\n")[0],
    )
    sub = parser.add_subparsers(dest="action", required=True)
    exp = sub.add_parser("export", help="write the monitoring stack's files into DIR")
    exp.add_argument("directory", type=Path)
    exp.add_argument("--force", action="store_true", help="replace files that exist")
    exp.add_argument(
        "--target",
        type=_check_target,
        default=DEFAULT_TARGET,
        metavar="HOST:PORT",
        help=f"the collector's /metrics for Prometheus to scrape (default {DEFAULT_TARGET}, "
        "where the exported collector.yaml serves it)",
    )
    args = parser.parse_args(argv)
    try:
        written = export(args.directory, args.force, args.target)
    except FileExistsError as exc:
        print(f"rlpulse deploy export: {exc}; pass --force to replace", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"rlpulse deploy export: cannot write {args.directory}: {exc}", file=sys.stderr)
        return 2
    print(f"{len(written)} files in {args.directory}")
    print(
        "run the collector on this host (rlpulse collector --config "
        f"{args.directory / 'collector.yaml'}), then: docker compose -f "
        f"{args.directory / 'docker-compose.yml'} up -d (or, without Docker: prometheus "
        f"--config.file={args.directory / PROMETHEUS_CONFIG}); Prometheus scrapes {args.target}"
    )
    return 0
