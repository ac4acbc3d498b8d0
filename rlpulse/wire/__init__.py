"""What the producer and the collector share below the protocol: the ZeroMQ client
(``transport``) and the names by which they find each other (``rendezvous``). Neither
package imports the other; both import this (and ``rlpulse.schemas``)."""
