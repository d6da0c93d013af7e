"""Node agent: engine subprocess supervision, readiness and health, hardware discovery.
"""
