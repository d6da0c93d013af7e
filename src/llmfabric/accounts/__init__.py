"""API keys, usage ledger and rate limits (SQLite by default, Postgres optional).
"""
