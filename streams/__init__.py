"""The Faust app, topic definitions and the settings object."""
