"""The `causeway` command line."""
