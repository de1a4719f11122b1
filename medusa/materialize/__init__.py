"""Materialization: analysis of recorded start-ups into a restore plan, and the driver that
records them (`medusa materialize`)."""
