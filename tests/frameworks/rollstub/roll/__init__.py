"""Stand-in for ROLL's package (see ../README.md)."""
