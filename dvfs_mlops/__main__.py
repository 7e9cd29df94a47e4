"""`python -m dvfs_mlops`: the `dvfs-mlops` command line."""
from dvfs_mlops.app.cli import main

main()
