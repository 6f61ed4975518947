"""``python -m data_prep``: the command line lives in :mod:`mpifc.cli.prep`."""
import sys

from mpifc.cli.prep import main

sys.exit(main())
