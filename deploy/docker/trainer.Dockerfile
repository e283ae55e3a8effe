# syntax=docker/dockerfile:1
# The training image job specs name in `image`: CUDA PyTorch, NVIDIA's resiliency
# extension (ft_launcher, in-process restart, async checkpointing) and ftplane's
# `trainer` package, run as `ft_launcher ... python -m trainer` by the kubernetes backend.
#
# Build from the repository root:
#   docker build -f deploy/docker/trainer.Dockerfile -t ftplane-trainer:0.1.0 .
#
# BASE_IMAGE: any CUDA build of PyTorch >= 2.6 with NCCL; NGC's PyTorch container is
# the reference (pick a current tag from the NGC catalog).
#
# EFA (p4d/p5 on EKS): NCCL reaches the EFA adapters through libfabric and the
# aws-ofi-nccl plugin, both installed by AWS's EFA installer (INSTALL_EFA=1, the
# default), at a pinned version (EFA_INSTALLER_VERSION; "latest" is refused: a rebuild
# must not change the network stack under a job). The pods request
# `vpc.amazonaws.com/efa` (spec.resources.efa_per_node), which the EFA device plugin on
# the node provides; the backend sets the NCCL/EFA variables that depend on the
# instance type (workers/backends/kubernetes/efa.py). Without EFA, build with
# --build-arg INSTALL_EFA=0 and NCCL uses TCP sockets.
#
# The entrypoint is the EFA check (deploy/docker/efa-check.sh): when EFA is expected
# (FTPLANE_EFA_EXPECTED=1, or EFA devices present) and the OFI plugin cannot be
# loaded, the container fails at once instead of training over TCP. A pod that sets
# its own `command` replaces the entrypoint; ftplane's pods also run the check as an
# init container.

ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:25.04-py3
FROM ${BASE_IMAGE}

ARG INSTALL_EFA=1
ARG EFA_INSTALLER_VERSION=1.47.0
# NVRx 0.7.0: the version the CUDA tests and GPU benchmarks ran (bench/RESULTS.md, gpu); hot spares
# (resiliency.spare_nodes) need 0.6 or later. Its wheel is for Python 3.12 and glibc 2.39 (NGC 25.x).
ARG NVRX_VERSION=0.7.0
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

RUN if [ "$EFA_INSTALLER_VERSION" = "latest" ]; then \
      echo "pin EFA_INSTALLER_VERSION to a release, not latest" >&2; exit 1; \
    fi; \
    if [ "$INSTALL_EFA" = "1" ]; then \
      apt-get update && apt-get install -y --no-install-recommends curl ca-certificates procps \
      && cd /tmp \
      && curl -fsSLO "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
      && tar -xf "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
      && cd aws-efa-installer \
      && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify \
      && cd / && rm -rf /tmp/aws-efa-installer* /var/lib/apt/lists/*; \
    else \
      apt-get update && apt-get install -y --no-install-recommends procps && rm -rf /var/lib/apt/lists/*; \
    fi

# libfabric/EFA for NCCL; what holds on every instance type (AWS's NVRx sample for EKS): fork
# safety (data loader workers fork), NVLS off. GPUDirect RDMA (FI_EFA_USE_DEVICE_RDMA) depends on
# the instance type: the backend sets it per pod.
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${LD_LIBRARY_PATH} \
    PATH=/opt/amazon/efa/bin:${PATH} \
    FI_EFA_FORK_SAFE=1 \
    RDMAV_FORK_SAFE=1 \
    NCCL_NVLS_ENABLE=0 \
    NCCL_DEBUG=WARN

RUN pip install "nvidia-resiliency-ext==${NVRX_VERSION}" "httpx>=0.27"

# The trainer package only (it imports nothing from the control plane).
COPY trainer /opt/ftplane/trainer
ENV PYTHONPATH=/opt/ftplane \
    PYTHONUNBUFFERED=1

COPY deploy/docker/efa-check.sh /opt/ftplane/bin/efa-check

# Runs as the image's default user: the kubernetes backend sets the command
# (the node agent, which starts ft_launcher) and mounts /dev/shm and the checkpoint volume.
WORKDIR /workspace
ENTRYPOINT ["/opt/ftplane/bin/efa-check"]
CMD ["python", "-m", "trainer", "--help"]
