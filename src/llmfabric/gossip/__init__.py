"""Dissemination of registry deltas: push-pull anti-entropy and piggybacked updates.
"""
