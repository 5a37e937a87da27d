"""Token mode: the proxy renders prompts with the model's own tokenizer and chat template
(`render`, `window`), samples from ids (`engine.TokenEngine`) and parses replies in the
model's tool-call format (`toolformats`, `parsers`)."""
