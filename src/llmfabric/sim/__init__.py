"""Serving simulator: hardware/model specs, roofline operator costs, discrete-event serving.
"""
