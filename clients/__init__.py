"""xattn clients: the `xattn.clients.api` library, the `xattn` CLI and the renderers.

Speaks only the xattn.v1 proto; never imports `model` or `service`.
"""
