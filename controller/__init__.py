"""Saturation detector, regime → policy table and metric definitions (docs/design.md §4, §5)."""
