"""`causeway rebuild`: rebuild a world's projections from its event log and swap it onto them."""
