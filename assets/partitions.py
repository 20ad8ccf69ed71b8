"""One partition per training run (or sweep trial): its key is the run id."""

import dagster as dg

training_runs = dg.DynamicPartitionsDefinition(name="training_runs")
