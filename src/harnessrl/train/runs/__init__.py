"""What a long training run adds around the trainer: atomic checkpoints (`checkpoint`),
the resume (`resume`), the task order and the eval split (`order`), eval while training
(`eval_during`); `long_run` hooks them into a run."""
