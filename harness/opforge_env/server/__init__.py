"""The server of opforge's OpenEnv environment (``server.app:app``)."""
