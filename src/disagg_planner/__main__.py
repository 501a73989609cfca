import sys

from disagg_planner.cli.main import main

sys.exit(main())
