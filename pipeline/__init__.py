"""rollout-shards: validated training shards from RL rollout sample tables.

Importing the package changes nothing global; the programs set what a build wants for
their own process (`pipeline.speed.tune_process`).
"""
