"""What the tests share: sample tables and builds, the CLI, trainer sources, Dagster roots."""
