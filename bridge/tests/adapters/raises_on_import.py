"""Test adapter whose import fails."""

raise RuntimeError("deliberate import-time failure")
