"""Deploying the serving stack: on a Ray cluster (a local one on 127.0.0.1 by default) and on Kubernetes
through KubeRay, from the same YAML file as `specdec serve --config` (its `deploy:` section adds only
what a cluster needs: placement, restarts, images, node selection).

Importing this package imports no Ray: `config` is plain dataclasses; `ray_stack`, `actors` and
`local_cluster` import Ray when called; `k8s` renders manifests without any cluster.
"""
