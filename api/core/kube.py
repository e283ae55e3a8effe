"""How ftplane's processes reach the Kubernetes API server: in the cluster with their ServiceAccount, else through a
kubeconfig context (FTPLANE_KUBE_CONTEXT). The worker's backend and the API's pod-log reader load it here."""

from __future__ import annotations

import os

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from api.core.config import Settings


class KubeConfigError(RuntimeError):
    """The configuration could not be loaded; the message says where it was looked for and what to do."""


def load_api_client(settings: Settings) -> k8s_client.ApiClient:
    """An API client from the in-cluster service account (`kube_in_cluster`, by default when running in a pod
    and no context is named) or the kubeconfig's context. urllib3's own retries are off: callers bound theirs."""
    in_cluster = settings.kube_in_cluster
    if in_cluster is None:
        in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not settings.kube_context
    configuration = k8s_client.Configuration()
    try:
        if in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=os.environ.get("KUBECONFIG"),  # read now, not at import time
                context=settings.kube_context,
                client_configuration=configuration,
            )
    except (k8s_config.ConfigException, OSError) as exc:
        where = "in-cluster service account" if in_cluster else f"kubeconfig context {settings.kube_context!r}"
        raise KubeConfigError(
            f"cannot load the Kubernetes configuration ({where}): {exc}. Run in the cluster with the "
            "ServiceAccount, or set FTPLANE_KUBE_CONTEXT to a context of your kubeconfig."
        ) from exc
    configuration.retries = False
    return k8s_client.ApiClient(configuration)
