"""The dataset on disk: committed Parquet files, their commit records, partitions, and what a SOURCE names."""
