"""``ridge render compose|k8s FLEET [-o DIR]``: write a deployment of a fleet file.

``compose`` writes ``compose.yaml`` and the files it mounts; ``k8s`` writes manifests and a
``kustomization.yaml`` (:mod:`gateway.render.compose`, :mod:`gateway.render.kubernetes`).
Files already in DIR that the deployment does not write are left alone. The command then says
what to run next and which secrets the deployment expects.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

from config.fleet import FleetConfigError, load_fleet
from gateway.render.assets import Assets, find_assets
from gateway.render.blueprint import (
    DEFAULT_IMAGES,
    Blueprint,
    Rendered,
    RenderError,
    RenderOptions,
    make_blueprint,
)
from gateway.render.compose import ENV_EXAMPLE, render_compose
from gateway.render.kubernetes import GRAFANA_SECRET, KEYS_SECRET, render_kubernetes

Renderer = Callable[[Blueprint, Assets, Path], Rendered]
TARGETS: Mapping[str, Renderer] = MappingProxyType({
    "compose": lambda blueprint, assets, out: render_compose(
        blueprint, assets, os.path.relpath(assets.root, out.resolve())),
    "k8s": lambda blueprint, assets, out: render_kubernetes(blueprint, assets),
})  # fmt: skip
"""Target name (compose, k8s) → its renderer (the output folder gives compose its build context)."""

HELP = MappingProxyType({
    "compose": "compose.yaml for one GPU host: ridge replicas, Redis, engines, Prometheus, "
               "Grafana",
    "k8s": "Kubernetes manifests: a Deployment per pool, ridge, Redis, Prometheus, Grafana",
})  # fmt: skip
IMAGE_SERVICES = ("ridge", *DEFAULT_IMAGES)
_DEFAULTS = RenderOptions()


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``render`` subcommand and its targets."""
    text = "write a deployment (compose or Kubernetes) from a fleet file"
    render = sub.add_parser("render", help=text, description=text[0].upper() + text[1:] + ".")
    targets = render.add_subparsers(dest="target", required=True)
    for name, text in HELP.items():
        target = targets.add_parser(name, help=text, description=text)
        target.add_argument("fleet", help="fleet YAML file")
        target.add_argument("-o", "--output", default=f"ridge-{name}",
                            help=f"output folder (default ridge-{name})")
        target.add_argument("--ridge-replicas", type=int, default=_DEFAULTS.ridge_replicas,
                            help="gateway replicas sharing Redis (default 2)")
        target.add_argument("--image", action="append", default=[], metavar="SERVICE=IMAGE",
                            help=f"another image for one of {', '.join(IMAGE_SERVICES)}")
        target.add_argument("--assets", type=Path, help="the ridge checkout whose Prometheus, "
                            "Grafana and Docker files to use (default: this one)")
        if name == "k8s":
            target.add_argument("--namespace", default=_DEFAULTS.namespace,
                                help="Kubernetes namespace (default ridge)")


def run(args: argparse.Namespace) -> int:
    """``ridge render ...``; the exit status."""
    out = Path(args.output)
    try:
        options = RenderOptions(ridge_replicas=args.ridge_replicas,
                                namespace=getattr(args, "namespace", _DEFAULTS.namespace),
                                images=parse_images(args.image))
        blueprint = make_blueprint(load_fleet(args.fleet), options)
        rendered = TARGETS[args.target](blueprint, find_assets(args.assets), out)
        write(out, rendered.files)
    except (FleetConfigError, RenderError, OSError) as exc:
        print(f"ridge render: {exc}", file=sys.stderr)
        return 2
    for warning in rendered.warnings:
        print(f"ridge render: warning: {warning}", file=sys.stderr)
    print(f"wrote {len(rendered.files)} files to {out}")
    print(next_steps(args.target, out, options, rendered.secrets))
    return 0


def parse_images(values: list[str]) -> dict[str, str]:
    """``SERVICE=IMAGE`` options as a mapping; RenderError for an unknown service."""
    images = {}
    for value in values:
        service, sep, image = value.partition("=")
        if not sep or not image or service not in IMAGE_SERVICES:
            raise RenderError(f"--image {value!r}: expected SERVICE=IMAGE with SERVICE one of "
                              f"{', '.join(IMAGE_SERVICES)}")
        images[service] = image
    return images


def write(out: Path, files: Mapping[str, str]) -> None:
    """Write every file under ``out``, creating folders."""
    for name, text in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def next_steps(target: str, out: Path, options: RenderOptions, secrets: list[str]) -> str:
    """What to run next, secrets first."""
    if target == "compose":
        lines = [f"next: put {', '.join(secrets)} in {out}/.env (see {out}/{ENV_EXAMPLE})"
                 ] if secrets else []
        lines.append(f"then: docker compose --project-directory {out} up -d --build")
        return "\n".join(lines)
    ns, literals = options.namespace, " ".join(f"--from-literal={s}=..." for s in secrets)
    lines = [f"next: kubectl create namespace {ns}"]
    if secrets:
        lines.append(f"      kubectl create secret generic {KEYS_SECRET} -n {ns} {literals}")
    lines.append(f"      kubectl create secret generic {GRAFANA_SECRET} -n {ns} "
                 "--from-literal=admin-password=...")
    lines.append(f"then: kubectl apply -k {out}")
    return "\n".join(lines)
