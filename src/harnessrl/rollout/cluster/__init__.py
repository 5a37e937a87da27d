"""Rollouts across a Ray cluster: the driver (`driver.py`), each node's actor (`node.py`) and
`run/eval --cluster ray` put together (`run.py`)."""
