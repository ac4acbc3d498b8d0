"""The Grafana dashboards: ``generate.py`` writes ``dashboards/`` in ``panels.py``'s vocabulary."""
