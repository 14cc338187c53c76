"""`causeway replay`: re-read a range of the change topics through the normal applier."""
