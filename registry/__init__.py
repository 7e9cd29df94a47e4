"""The registry data: `governor.yaml` (the registered model's name, aliases and promotion gates) and `baselines/`
(the published tree). Data only; pyproject.toml maps this folder into the package as `dvfs_mlops.registry_data`,
so an editable install reads these files and a wheel carries them."""
