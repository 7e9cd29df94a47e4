"""Integrations with other training stacks."""
