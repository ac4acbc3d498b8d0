"""``rlpulse deploy export DIR``: the monitoring stack's files, from the installed package.

Writes ``prometheus/`` (``prometheus.yml``, ``rules/``, the rules' promtool tests),
``grafana/`` (dashboards and provisioning), ``rlpulse.collector.yaml``, and ``docker-compose.yml``:
Prometheus and Grafana in containers, scraping a collector that runs on the host
(``rlpulse collector --config collector.yaml``; the compose file maps the name ``collector``
to the host). Files already in ``DIR`` are kept unless ``--force``.

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


def export(directory: Path, force: bool = False) -> list[Path]:
    """Write the files under ``directory``; return them. Raises ``FileExistsError`` naming a
    file that exists (unless ``force``)."""
    plan = {source: directory / target for source, target in files().items()}
    if not force:
        clash = [str(p) for p in plan.values() if p.exists()]
        if clash:
            raise FileExistsError(f"{clash[0]} exists ({len(clash)} files would be replaced)")
    for source, target in plan.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
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
    args = parser.parse_args(argv)
    try:
        written = export(args.directory, args.force)
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
        f"{args.directory / 'docker-compose.yml'} up -d"
    )
    return 0
