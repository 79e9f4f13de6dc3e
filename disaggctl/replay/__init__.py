"""``disaggctl replay``: production traces replayed open loop on the simulator (one arm per
policy, ``sim_arm``) or against a running service (``live``, ``live_arm``), and the report
both write (``outcome``, ``report``)."""
