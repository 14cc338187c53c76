"""`causeway dlq`: read the dead-letter topic and redrive letters."""
