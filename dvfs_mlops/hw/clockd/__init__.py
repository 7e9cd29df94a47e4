"""The clock service (`dvfs-mlops clockd`): a small root process that pins GPU clocks for members of a group.

Clients talk to it over an AF_UNIX stream socket in JSON lines (`protocol`); a pin lives as long as the client's
connection (`server`); sessions of a non-root user reach it by themselves (`client.route`).
"""
