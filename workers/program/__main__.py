"""`python -m workers.program LAUNCH_JSON`: see `workers.program.runner`.

The program ends with `os._exit` once its output is flushed: its work is done and saved
(a checkpoint's files are closed when the save returns), and tearing down an interpreter
that loaded torch takes seconds in which the rank still holds its GPU and its gang waits.
"""

import os
import sys

from workers.program.runner import main

code = main(sys.argv)
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
