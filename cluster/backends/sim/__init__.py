"""The simulated backend (the default): each worker actor runs one of the simulator's wall-time
engines (``cluster.sim``) for the configured hardware profile, at ``speedup`` virtual seconds per
wall second (docs/design.md "Serve runtime").

- ``workers``: the prefill and decode worker actors; ``token_streams``: a decode worker's side
  of its token stream, ``decode_streams`` the ingress replica's side;
- ``backend``: the replica's ``Backend`` (place on the replica's router, prefill and decode on
  the worker actors), ``path``: the replica's path factory;
- ``plug``: the registry entry (``PLUG``), and the driver's steps (:class:`SimEngines`).
"""

from cluster.backends.sim.plug import PLUG, SimEngines, SimPlug

__all__ = ["PLUG", "SimEngines", "SimPlug"]
