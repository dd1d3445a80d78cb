"""What people look at: waterfalls, Perfetto traces, the HTML page, plots, vLLM span stitching."""
