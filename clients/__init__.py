"""xattn clients: the `clients.api` library, the `xattn` CLI and the renderers.

Speaks only the xattn.v1 proto; never imports `model` or `service`.
"""
