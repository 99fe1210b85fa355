"""Optional execution backends (real hardware instead of a batch-time model)."""
