"""`python3 -m tailcut.pool`: see tailcut.pool._cli."""

import sys

from tailcut.pool import main

sys.exit(main())
