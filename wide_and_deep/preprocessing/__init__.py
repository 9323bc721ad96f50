"""Outbrain CSVs to the Wide & Deep training records (reference §9, V1 Spark pipeline): one SQL
pipeline (`sql.py`) run by DuckDB (default) or Spark, the numeric steps and the TFRecord writer
(`records.py`), the driver (`pipeline.py`) and the entry point (`python -m wide_and_deep.preprocessing`)."""
