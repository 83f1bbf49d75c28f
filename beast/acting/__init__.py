"""Acting: actor processes, central inference, the supervisor that restarts actors, the
fork server that starts them and the board on which they report their deaths."""
