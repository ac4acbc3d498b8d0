"""What comes in: the socket and its bounds (``receiver``), exactly-once ordering and the
acknowledgements (``delivery``; when each is owed: ``acktimes``), and producers' clocks
bounded by the collector's (``clock``)."""
