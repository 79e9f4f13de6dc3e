"""``disaggctl experiment``: the experiments of docs/design.md §8 on the simulator.

One module per experiment (``poa``, ``pareto``, ``adaptive``, ``autobid``, ``auction``), each
planning independent simulations (``fanout.Job``), analysing their results into means ± 1 standard
error over the trials (``stats``) and writing CSVs, PNGs (``plots``) and a Markdown section
(``report``); ``runner`` runs them, ``cli`` is the subcommand.
"""
