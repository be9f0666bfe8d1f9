"""The Wyoming face: Home Assistant's speech-to-text protocol over TCP, on the engine (audio,
info, command, handler, server, discovery)."""
