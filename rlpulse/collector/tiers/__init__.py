"""Relays under a root collector: a relay's output (``relay``), the delta both ends speak
(``delta``) and the relay's sink to the collector above (``upstream``). Running the tiers on
Ray is ``rlpulse.collector.onray``."""
