"""Runtime adapters: workloads, simulated engines, buses (docs/design.md §6)."""
