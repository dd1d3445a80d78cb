"""The tables every analysis reads, and the vectorized pieces over them: schema, records, the span tree, intervals."""
