"""`causeway offsets`: consumer-group lag and offset resets."""
