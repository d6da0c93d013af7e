"""`llmfabric k8s render PROFILE`: Kubernetes manifests for an ingress and providers.

    llmfabric k8s render examples/k8s.yaml | kubectl apply -f -
"""

from __future__ import annotations

import pathlib
import sys

import click

from llmfabric.launch.errors import LaunchError
from llmfabric.launch.k8s import dump_manifests, load_k8s_profile, render_k8s


@click.group(name="k8s")
def command() -> None:
    """Run a fabric on Kubernetes."""


@command.command()
@click.argument("profile", type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path))
def render(profile: pathlib.Path) -> None:
    """Print the manifests (YAML, `---`-separated) for PROFILE: the ingress Deployment and
    Service, one Deployment per provider."""
    try:
        sys.stdout.write(dump_manifests(render_k8s(load_k8s_profile(profile))))
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from None
