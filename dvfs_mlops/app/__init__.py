"""The app: the `dvfs-mlops` command line and the commands' own work."""
