"""``state_dir``: nothing accepted is lost in a crash. The write-ahead log and the outbox
(``segmentlog``), recovery and checkpoints (``durable``), each sink's cursor over the outbox
(``outbox``), the files' formats (``statefiles``) and the one-process lock (``statelock``)."""
