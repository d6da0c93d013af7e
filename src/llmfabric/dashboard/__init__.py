"""Web UI served at /ui: catalog, nodes, keys, usage, chat playground, registry inspector.
"""
