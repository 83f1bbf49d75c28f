"""Learning: the learner loop that updates any algorithm, and its thread tuner."""
