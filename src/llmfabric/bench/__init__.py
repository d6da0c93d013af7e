"""Load generator client: arrival processes, TTFT/TPOT/throughput, results.
"""
