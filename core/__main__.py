"""`python -m forksight ...` is the `forksight` command."""
import sys

from forksight.compose.cli import main

sys.exit(main())
