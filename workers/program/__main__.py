"""`python -m workers.program LAUNCH_JSON`: see `workers.program.runner`."""

import sys

from workers.program.runner import main

sys.exit(main(sys.argv))
