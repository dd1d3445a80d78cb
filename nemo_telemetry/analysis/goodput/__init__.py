"""The goodput rules: per-step bucket sums, windows, unions and the run totals."""
