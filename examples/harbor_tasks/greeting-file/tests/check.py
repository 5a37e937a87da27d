from pathlib import Path
here = Path("/opt/greeter")
assert (here / "BUILD_INFO").read_text() == "Hello, build-step! (greet 1.0.0)\n"
assert (here / "hello.txt").read_text() == "Hello, world! (greet 1.0.0)\n"
