"""Multi-rank runs: per-rank event tables in Parquet and their merge, SQL over the files with DuckDB."""
