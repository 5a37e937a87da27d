"""Run the tests in this directory against the agent's work in $WORKDIR.

The work dir goes at the END of sys.path and no config, conftest or plugin outside this
directory is read, so nothing the agent left behind can shadow pytest or change the run.
A script, never imported: every bundled task carries a copy as tests/run_tests.py, and
inline tasks with a test_file get one next to it. Without pytest it exits 127, which the
verifier reports as "could not run" (an infrastructure error), never as a failed test.
"""

import os
import sys

sys.path.append(os.environ.get("WORKDIR", os.getcwd()))
try:
    import pytest
except ImportError as error:  # 127, a shell's "not found": the tests cannot run at all
    sys.stderr.write(f"run_tests.py: {sys.executable} cannot import pytest: {error}\n")
    sys.exit(127)

here = os.path.dirname(os.path.abspath(__file__))
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", here,
                      "--confcutdir", here, here]))
