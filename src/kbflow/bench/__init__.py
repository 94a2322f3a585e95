"""`kbflow bench ...`: measurements written as JSON (and plots), never timed tests. Not part of the pipeline."""
