"""Sandboxes: where a harness and a task's verifier run (local, docker), the launchers each
command starts through, and the owners registry that sweeps what a dead runner left."""
