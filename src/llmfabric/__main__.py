"""`python -m llmfabric` runs the CLI."""

from llmfabric.cli.main import main

main()
