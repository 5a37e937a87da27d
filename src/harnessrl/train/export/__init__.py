"""A run's store written out for other tools: turns or rollouts as JSONL or Parquet
(`rollouts`, `harnessrl export`), SFT datasets (`sft`)."""
