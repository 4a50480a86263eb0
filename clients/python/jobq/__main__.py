"""`python -m jobq`: the `jobq` command."""

from jobq.cli import main

main()
