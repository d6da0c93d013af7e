"""Node identity and admission: Ed25519 node keys, peer ids, signing, TLS certificates, credentials.
"""
