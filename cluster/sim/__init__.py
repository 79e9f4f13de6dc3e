"""The simulated disaggregated cluster (DESIGN §6 "Simulated")."""
