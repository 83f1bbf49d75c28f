"""A run: the command line's glue, start-up, the run's build and resume, the threaded and
serial loops, the evaluator, the actor layout's autosize."""
