"""Request routing: candidates from the local replica, trust/QoS filters, policies, retries.
"""
