"""The CRDT registry: signed node records (records.py), the G-Map and its merge,
NodeRegistry/ModelRegistry views, GC.
"""
