"""Experience between acting and learning: rollout slots and their source, the replays
(rollouts, sequences, transitions, prioritized), the sinks actors write into, staging."""
