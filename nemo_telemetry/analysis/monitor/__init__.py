"""``monitor``: the goodput rules applied while the run trains (state, sources, metrics out)."""
