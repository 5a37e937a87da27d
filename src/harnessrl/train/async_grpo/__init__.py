"""The asynchronous GRPO trainer: TRL's `AsyncGRPOTrainer` fed by harnessrl's rollout
worker (`worker`), whole groups per step (`batches`), weights to vLLM by version
(`transfer`), the colocated schedule and sleep mode (`schedule`, `sleep`), several trainer
processes (`processes`); `loop` runs it."""
