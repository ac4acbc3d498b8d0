"""Deployment files: Prometheus config, rules and their tests, Grafana dashboards and
provisioning, a collector config, compose files, systemd and Kubernetes manifests. Shipped
in the wheel as package data; ``rlpulse deploy export DIR`` writes them out
(:mod:`rlpulse.deploy.export`)."""
