"""Tasks: loading and scoring one (`task.py`), checking, listing and splitting a set
(`taskset.py`), generated families (`tablegen.py`)."""
