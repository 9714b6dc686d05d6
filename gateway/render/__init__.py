"""``ridge render compose|k8s FLEET``: a complete deployment written from one fleet file.

Off the request path: nothing the gateway serves with imports this package; only the ``ridge``
command does, when asked to render. The pieces:

- :mod:`gateway.render.blueprint`: what to deploy, independent of the target (names, replicas,
  every engine's command line from :mod:`backends.launch.recipes` — the same functions the
  real-engine tests launch vLLM with — GPUs, probes, the fleet file with in-deployment
  endpoints);
- :mod:`gateway.render.assets`: the project files a deployment reuses (Prometheus rules,
  Grafana dashboards and provisioning, the Dockerfile);
- :mod:`gateway.render.monitoring`: Prometheus scrape configurations for each target;
- :mod:`gateway.render.compose` and :mod:`gateway.render.kubernetes`: the two targets;
- :mod:`gateway.render.cli`: the command.
"""
