"""The HTTP faces of the sidecar (aiohttp): the API the gateway calls, a paired node's
read-only transcript server, and the wake call to the gateway."""
