"""What a pod that asks for EFA needs besides the devices: NCCL's and libfabric's environment, IPC_LOCK, and a
check that fails the pod loudly when NCCL would otherwise fall back to TCP sockets without a word.

The environment follows AWS's NVRx sample for EKS (awsome-distributed-training, pytorch/nvrx/kubernetes):
the EFA provider, fork safety for libfabric and rdma-core (data loader workers fork), NVLS off, NCCL's
socket interfaces kept off docker/loopback/veth, the OFI tuner, and its buffer sizes. What differs by
instance type is in PER_INSTANCE_TYPE (GPUDirect RDMA over EFA on p5-class nodes; the sample leaves it
off for p4de); with no instance type pinned by the spec, the OFI plugin decides for itself. A variable
the spec sets in `env` wins over these.

The check (deploy/docker/efa-check.sh, installed in the trainer image as EFA_CHECK) runs as an init
container holding the same devices and the trainer's NCCL and libfabric variables, and resolves the network
plugin as NCCL would: no EFA device in the pod or no EFA provider is the node's fault (exit 94: the node is
blamed); NCCL loading no plugin, another than aws-ofi-nccl, or one that cannot load, is the image's (exit 78:
the job fails). An image without the script skips it.
"""

from __future__ import annotations

from typing import Any

from api.schemas.spec import JobSpec
from workers.backends.kubernetes.placement import instance_type
from workers.backends.kubernetes.policy import EFA_CHECK_CONTAINER

EFA_RESOURCE = "vpc.amazonaws.com/efa"
EFA_CHECK = "/opt/ftplane/bin/efa-check"
EFA_ENVIRONMENT = {
    "FI_PROVIDER": "efa",
    "NCCL_NET_PLUGIN": "ofi",  # NCCL opens libnccl-net-ofi.so, not whichever libnccl-net.so comes first
    "FI_EFA_FORK_SAFE": "1",
    "RDMAV_FORK_SAFE": "1",
    "FI_LOG_LEVEL": "warn",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_SOCKET_IFNAME": "^docker,lo,veth",
    "NCCL_TUNER_PLUGIN": "/opt/amazon/ofi-nccl/lib/libnccl-ofi-tuner.so",
    "NCCL_BUFFSIZE": "8388608",
    "NCCL_P2P_NET_CHUNKSIZE": "2097152",
    "FTPLANE_EFA_EXPECTED": "1",
}
_RDMA = {"FI_EFA_USE_DEVICE_RDMA": "1"}
PER_INSTANCE_TYPE: dict[str, dict[str, str]] = {
    "p5.48xlarge": _RDMA,
    "p5e.48xlarge": _RDMA,
    "p5en.48xlarge": _RDMA,
    "p6-b200.48xlarge": _RDMA,
    "p4d.24xlarge": {},
    "p4de.24xlarge": {},
}
# sh, so an image without the check still starts
CHECK_COMMAND = ["sh", "-c", f'if [ -x {EFA_CHECK} ]; then exec {EFA_CHECK}; fi; echo "no {EFA_CHECK} in this image"']


def wanted(spec: JobSpec) -> bool:
    return spec.resources.efa_per_node > 0


def environment(spec: JobSpec) -> dict[str, str]:
    """The EFA variables of the spec's pods (none without EFA), those the spec sets itself left out."""
    if not wanted(spec):
        return {}
    env = {**EFA_ENVIRONMENT, **PER_INSTANCE_TYPE.get(instance_type(spec) or "", {})}
    return {k: v for k, v in env.items() if k not in spec.env and k not in spec.secret_env}


def capabilities(spec: JobSpec) -> dict[str, Any] | None:
    """The trainer container's securityContext: IPC_LOCK to pin memory for RDMA."""
    return {"capabilities": {"add": ["IPC_LOCK"]}} if wanted(spec) else None


def check_container(spec: JobSpec) -> dict[str, Any] | None:
    """The init container that checks EFA with the pod's devices before the trainer starts."""
    if not wanted(spec):
        return None
    devices = {EFA_RESOURCE: str(spec.resources.efa_per_node)}
    return {
        "name": EFA_CHECK_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": CHECK_COMMAND,
        "env": [{"name": "FTPLANE_EFA_EXPECTED", "value": "1"}, *_network_env(spec)],
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi", **devices},
            "limits": {"memory": "128Mi", **devices},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _network_env(spec: JobSpec) -> list[dict[str, str]]:
    """The trainer's NCCL and libfabric variables (and library path), for the check to see what NCCL would load."""
    values = {**environment(spec), **spec.env}
    keep = [k for k in values if k.startswith(("NCCL_", "FI_")) or k == "LD_LIBRARY_PATH"]
    return [{"name": k, "value": values[k]} for k in keep]
