"""SWIM failure detection: probes, indirect probes, Lifeguard suspicion, refutation, eviction.
"""
