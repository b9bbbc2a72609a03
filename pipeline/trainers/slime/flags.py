"""slime's command-line readers: its model-shape flags are miles' (Megatron's), read as
miles reads them."""

from __future__ import annotations

from pipeline.trainers.miles.flags import parse_layer_pattern

# Command-line readers of the settings whose value is not one scalar type.
FLAG_READERS = {"moe_layer_freq": parse_layer_pattern}
