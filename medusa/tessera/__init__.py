"""Tessera: kernel-granularity disaggregation. Per-node read/write extents of captured graphs
(accesses), their cross-check against the two-run pointer classification (crosscheck), the
dependency graph (depgraph), a MILP partition across unlike devices (planner), and a
simulator of pipelined execution (simulator)."""
