"""python -m knapformer ...: the `knapformer` command (knapformer/cli.py)."""
from knapformer.cli import main

main()
