"""`rollout-shards parity A B`: where two payloads part, field by field and bitwise.

Two builds (output roots or step folders) are keyed by (step, batch_position); two
sample-table inputs (anything the readers load) by (step, index, leaf). This is the check
miles' v1/v2 parity test makes on a training payload (PR #2536: `rollout_id` None on one
path, 0 on the other). `sources` reads the two sides, `compare` compares them, `report`
renders what was found as text or JSON, and `payloads.parity` runs the three.
"""
