"""OpenAI-compatible HTTP front: auth, routing, streaming proxy, forwarding.
"""
