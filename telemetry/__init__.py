"""The Prometheus metrics every room reports to (docs/design.md §5): one registry, defined once in
``telemetry/metrics.py``. Plain ``prometheus_client``: no Ray, NATS or HTTP; the runtime adapters
in ``cluster/`` serve it."""
