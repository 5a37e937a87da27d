"""Run the tests in this directory against the agent's work in $WORKDIR.

The work dir goes at the END of sys.path and no config, conftest or plugin outside this
directory is read, so nothing the agent left behind can shadow pytest or change the run.
A script, never imported: every bundled task carries a copy as tests/run_tests.py, and
inline tasks with a test_file get one next to it.
"""

import os
import sys

sys.path.append(os.environ.get("WORKDIR", os.getcwd()))
import pytest

here = os.path.dirname(os.path.abspath(__file__))
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", here,
                      "--confcutdir", here, here]))
