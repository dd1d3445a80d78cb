"""Compiled (numba) code only, behind one seam (``compiled``), with its numpy reference paths; the warm-up that compiles them ahead of time is ``ingestion.warmup``, since it runs ingest."""
