"""Trace schema, loaders, workload characterization and plots.
"""
