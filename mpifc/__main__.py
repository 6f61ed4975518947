import sys

from mpifc.cli import main

sys.exit(main())
