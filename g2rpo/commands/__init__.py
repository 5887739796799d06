"""Argument definitions for ``g2rpo`` subcommands, one module per area (see g2rpo.cli)."""
