"""`python -m forksight ...` is the `forksight` command."""
import sys

from forksight.compose.cli import main

if __name__ == "__main__":       # not when a spawned child (the lake writer) imports this module
    sys.exit(main())
