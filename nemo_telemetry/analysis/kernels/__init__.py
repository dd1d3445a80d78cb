"""Compiled (numba) code only, behind one seam (``_compiled``), with its numpy reference paths and the warm-up."""
