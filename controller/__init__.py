"""Saturation detector, regime → policy table, the control loop and the re-split lever
(docs/design.md §4); the metrics it sets live in `telemetry/`."""
