import subprocess
from pathlib import Path
here = Path("/usr/src/backup")
want = "a.txt 6\nc.dat 2\nsub/b.txt 12\n"
assert (here / "manifest.txt").read_text() == want
(here / "manifest.txt").unlink()
subprocess.run(["./backup.sh"], cwd=here, check=True)  # the script itself is fixed
assert (here / "manifest.txt").read_text() == want
