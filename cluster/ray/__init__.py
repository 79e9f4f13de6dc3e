"""Ray adapters: the plain objects of the math rooms and the simulator, run as Ray actors
(docs/design.md "Serve runtime"). Nothing here holds logic of its own beyond wiring: each actor
is a thin shell over a plain object that the unit tests exercise directly."""
