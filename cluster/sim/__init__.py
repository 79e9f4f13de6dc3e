"""The simulated disaggregated cluster (docs/design.md §6 "Simulated")."""
