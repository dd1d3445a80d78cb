"""The findings: what would make a goodput number lie, each with a stable code."""
