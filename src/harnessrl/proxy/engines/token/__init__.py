"""Token mode: the proxy renders prompts and parses replies itself and samples from ids
(`engine.TokenEngine`). Per model (`formats`): a `renderers` family renders, parses and
bridges turns (`family`, `replies`), or the model's own chat template renders (`render`,
`window`) and replies are parsed by vLLM's parser names (`replies`; `hermes` and
`qwen3_coder` incrementally here: `parsers`, `toolformats`)."""
