"""The saturation detector, the regime → policy table and the metric definitions (DESIGN §4, §5)."""
