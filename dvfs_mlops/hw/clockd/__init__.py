"""The clock service (`dvfs-mlops clockd`): a small root process that pins GPU clocks for members of a group.

Clients talk to it over an AF_UNIX stream socket in JSON lines (`protocol`); the service (`server`) listens in a folder
only root controls (`listener`), knows each client by the kernel's word (`connection`), and takes its limits and NVML
scope from its command line and a root-owned config file (`config`); a pin lives while the client's connection is
open and the client renews it, and sessions of a non-root user reach it by themselves (`client.route_pin`).
"""
