"""verl: GRPO advantages over contiguous prompt groups of `rollout_n` rows, verl's
balance_batch reordering, and padded prompt and response widths. Reached through
`pipeline.trainers.profile("verl")`."""
