"""What goes out: a finished step as a record (``records``: the ``StepOutput`` seam, with the
throughput ``derived`` from it), handed to every sink on its own thread (``fanout``), with the
Prometheus names (``promnames``) and the scrape targets for service discovery
(``discovery``). The sinks themselves are ``rlpulse.collector.sinks``."""
