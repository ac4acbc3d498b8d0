"""The producer's environment variables, read in this one place."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping

from rlpulse.schemas.errors import ConfigError
from rlpulse.wire.rendezvous import (
    DEFAULT_ADDRESS,
    RAY_NAMESPACE,
    relay_actor_name,
)
from rlpulse.wire.transport import CurveKeys, load_curve

ADDRESS_VAR = "RLPULSE_ADDRESS"
"""Collector address for workers that are not told one (Ray actors inherit it via runtime_env)."""


RESUME_VAR = "RLPULSE_RESUME"
"""``1``: producers continue their run even if it ended on the collector (a job restarted from
a checkpoint under the same run name); otherwise such a run starts a new attempt there."""


def resume_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """``RLPULSE_RESUME`` set to 1/true/yes; or a process torchrun restarted
    (``TORCHELASTIC_RESTART_COUNT`` above 0), which continues the run it was part of."""
    if environ.get(RESUME_VAR, "").strip().lower() in ("1", "true", "yes"):
        return True
    restarts = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return restarts.isdigit() and int(restarts) > 0


EXPECTED_ROLES_VAR = "RLPULSE_EXPECTED_ROLES"
"""Roles of the run that producers of this process declare (``driver=1,actor_train=8``):
the collector waits for each by name, up to its ``liveness_s``, instead of emitting steps
without one that registers late. verl's setup hook sets ``driver=1`` when it is unset."""


def expected_roles_from_env(environ: Mapping[str, str] = os.environ) -> dict[str, int]:
    """``RLPULSE_EXPECTED_ROLES`` as role -> world size ({} when unset); ConfigError naming
    the variable when it is not ``role=size,...`` with sizes >= 1."""
    raw = environ.get(EXPECTED_ROLES_VAR, "").strip()
    roles: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        role, _, size = item.partition("=")
        if not role.strip() or not size.strip().isdigit() or int(size) < 1:
            raise ConfigError(
                EXPECTED_ROLES_VAR, "must be role=world_size,... (driver=1,actor_train=8)", raw
            )
        roles[role.strip()] = int(size)
    return roles


ENGINES_VAR = "RLPULSE_ENGINES"
"""Engine servers' ``/metrics`` URLs, comma-separated, whose metrics the process that drives the
rollout logs per step (``rlpulse.producer.enginewatch``): for engines started from a shell
(``rlpulse register ... -- vllm serve ...``), which the driver cannot find by itself. The verl
hook and the TRL callback add the servers they find to these."""


ENGINES_TIMEOUT_VAR = "RLPULSE_ENGINES_TIMEOUT_S"
"""How long the rollout's driver waits for an engine's ``/metrics`` at a window's begin or end
(``EngineWatchConfig.timeout_s``), for the watches the verl hook and the TRL callback make."""


def engines_timeout_from_env(environ: Mapping[str, str] = os.environ) -> float | None:
    """``RLPULSE_ENGINES_TIMEOUT_S`` in seconds (None when unset); ConfigError naming the
    variable when it is no positive number."""
    raw = environ.get(ENGINES_TIMEOUT_VAR, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(ENGINES_TIMEOUT_VAR, "must be a positive number of seconds", raw)
    return value


def engines_from_env(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """``RLPULSE_ENGINES`` split at its commas (() when unset); the watch checks each URL
    (``rlpulse.producer.enginewatch.checked_urls``)."""
    return tuple(filter(None, (p.strip() for p in environ.get(ENGINES_VAR, "").split(","))))


def default_address(environ: Mapping[str, str] = os.environ) -> str:
    """``RLPULSE_ADDRESS``; else, in a Ray job whose driver started collectors with
    ``rlpulse.collector.onray``, the relay on this process's node; else ``tcp://127.0.0.1:5555``."""
    return environ.get(ADDRESS_VAR) or node_relay_address() or DEFAULT_ADDRESS


def node_relay_address(timeout_s: float = 30.0) -> str | None:
    """The address of this node's relay when this process is a Ray driver or worker and its
    job runs one (``rlpulse.collector.onray``); None otherwise. Ray is not imported here: a process
    that has not imported it is not in a Ray job."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    name = relay_actor_name(context.get_job_id(), context.get_node_id())
    try:
        relay = ray.get_actor(name, namespace=RAY_NAMESPACE)
    except ValueError:  # no relay on this node for this job
        return None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(relay.address.remote(), timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.ActorUnavailableError:  # Ray is restarting it: wait
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
        except Exception as exc:  # a dead or stuck relay: say so, never guess another address
            raise RuntimeError(
                f"rlpulse: this node's relay {name!r} did not answer: {exc}"
            ) from exc


CURVE_SERVER_KEY_VAR = "RLPULSE_CURVE_SERVER_KEY"
"""Path of the collector's public key file (``*.key``), or the Z85 key itself."""
CURVE_CLIENT_CERT_VAR = "RLPULSE_CURVE_CLIENT_CERT"
"""Path of this client's secret certificate file (``*.key_secret``)."""


def curve_from_env(environ: Mapping[str, str] = os.environ) -> CurveKeys | None:
    """CurveZMQ keys from the environment, or None when encryption is not configured."""
    server = environ.get(CURVE_SERVER_KEY_VAR)
    client = environ.get(CURVE_CLIENT_CERT_VAR)
    if not server and not client:
        return None
    if not (server and client):
        raise ValueError(
            f"set both {CURVE_SERVER_KEY_VAR} and {CURVE_CLIENT_CERT_VAR} for CurveZMQ, or neither"
        )
    return load_curve(server, client)
