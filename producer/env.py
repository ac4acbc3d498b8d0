"""The producer's environment variables, read in this one place."""

from __future__ import annotations

import os
from collections.abc import Mapping

from producer.transport import CurveKeys

ADDRESS_VAR = "RLPULSE_ADDRESS"
"""Collector address for workers that are not told one (Ray actors inherit it via runtime_env)."""
DEFAULT_ADDRESS = "tcp://127.0.0.1:5555"


def default_address(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get(ADDRESS_VAR) or DEFAULT_ADDRESS


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


def load_curve(server_key: str, client_cert: str) -> CurveKeys:
    """Read keys made by ``python -m collector keygen`` (zmq.auth certificate files)."""
    import zmq.auth

    if os.path.exists(server_key):
        server_public, _ = zmq.auth.load_certificate(server_key)
    else:
        server_public = server_key.encode()
    public, secret = zmq.auth.load_certificate(client_cert)
    if secret is None:
        raise ValueError(f"{client_cert} holds no secret key: pass the *.key_secret file")
    return CurveKeys(server_public=server_public, public=public, secret=secret)
