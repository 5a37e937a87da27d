"""The trace store: one SQLite file per run directory (`RUN_DIR/trace.db`) holding every
captured turn, rollout and outcome (docs/store.md). `reader.TraceReader` reads a run,
`writer.TraceStore` writes one; `schema` (the columns and their migrations), `rows` (a
row's packing), `layout` and `delta` (a turn stored as what is new against an earlier one).

The bottom layer with `http/`: it knows the shared vocabulary (`types.py`, `errors.py`)
and nothing of the proxy, the runner or the trainer that write and read it."""
