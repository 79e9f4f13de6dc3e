"""disaggctl: composition root and CLI."""
