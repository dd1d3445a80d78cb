"""Engines drive the rules over data: in memory, out of core (batch by batch), or on Ray."""
