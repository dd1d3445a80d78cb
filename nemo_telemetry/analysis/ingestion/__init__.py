"""OTLP in: dump files detected and decoded (JSON, protobuf), the ``collect`` receiver, metrics and logs dumps, the kernels' ``warmup``."""
