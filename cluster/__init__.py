"""Runtime adapters: workloads, simulated engines, buses (DESIGN §6)."""
