"""The saturation detector, the regime → policy table and the metric definitions (docs/design.md §4, §5)."""
