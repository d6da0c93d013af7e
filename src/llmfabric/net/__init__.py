"""Transport: TLS peer channels with pinned peer ids, bootstrap and backoff, reachability, relays.
"""
