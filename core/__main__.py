"""`python -m forksight ...` is the `forksight` command."""
import sys

from forksight.cli import main

sys.exit(main())
