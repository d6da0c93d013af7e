"""Placement: CP-SAT solver, baselines (memP, greedy), fleet controller.
"""
