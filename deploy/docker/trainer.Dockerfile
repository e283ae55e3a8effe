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
# default). The pods request `vpc.amazonaws.com/efa` (spec.resources.efa_per_node),
# which the EFA device plugin on the node provides; without EFA, build with
# --build-arg INSTALL_EFA=0 and NCCL uses TCP sockets.

ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:25.04-py3
FROM ${BASE_IMAGE}

ARG INSTALL_EFA=1
ARG EFA_INSTALLER_VERSION=latest
ARG NVRX_VERSION=0.4.1
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

RUN if [ "$INSTALL_EFA" = "1" ]; then \
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

# libfabric/EFA for NCCL (harmless when the pod has no EFA device: NCCL falls back to sockets)
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${LD_LIBRARY_PATH} \
    FI_PROVIDER=efa \
    FI_EFA_USE_DEVICE_RDMA=1 \
    NCCL_DEBUG=WARN

RUN pip install "nvidia-resiliency-ext==${NVRX_VERSION}" "httpx>=0.27"

# The trainer package only (it imports nothing from the control plane).
COPY trainer /opt/ftplane/trainer
ENV PYTHONPATH=/opt/ftplane \
    PYTHONUNBUFFERED=1

# Runs as the image's default user: the kubernetes backend sets the command
# (ft_launcher) and mounts /dev/shm and the checkpoint volume.
WORKDIR /workspace
CMD ["python", "-m", "trainer", "--help"]
