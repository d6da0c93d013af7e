"""Engines we ship: the simulated OpenAI-compatible engine.
"""
