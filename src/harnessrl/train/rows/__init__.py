"""How rollouts become training rows, as pure functions: each chain one sample
(`samples`), the group advantage and the replies masked or penalised (`grpo`), the
importance-sampling correction against the engine's logprobs (`importance`)."""
