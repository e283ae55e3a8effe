# syntax=docker/dockerfile:1
# The training image job specs name in `image`: CUDA PyTorch, NVIDIA's resiliency
# extension (ft_launcher, in-process restart, async checkpointing) and ftplane's
# node side (`pip install ftplane`: the node agent `ftplane-agent`, the SDK, the built-in trainer
# `python -m ftplane.trainer`), with httpx as its only dependency beside NVRx.
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
# must not change the network stack under a job). As AWS's sample does on this same NGC
# base (awsome-distributed-training, 2.ami_and_containers/2.docker/0.nvcr-pytorch-aws.dockerfile),
# NGC's own network stack goes first: its libibverbs and mlx5 packages (the installer
# brings the rdma-core EFA needs), HPC-X's Open MPI (not all of /opt/hpcx: torch links
# its UCX), and the NCCL network plugins NGC ships (HPC-X's SHARP plugin is a
# libnccl-net.so, which NCCL would load instead of EFA's). NCCL_NET_PLUGIN=ofi then names
# the plugin NCCL opens: libnccl-net-ofi.so, the installer's. The pods request
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
      apt-get update \
      && apt-get remove -y --allow-change-held-packages libmlx5-1 ibverbs-utils libibverbs-dev libibverbs1 || true; \
      rm -rf /opt/hpcx/ompi /usr/local/mpi /opt/hpcx/nccl_rdma_sharp_plugin /opt/amazon/aws-ofi-nccl \
      && rm -f /usr/lib/x86_64-linux-gnu/libnccl-net*.so* /usr/local/lib/libnccl-net*.so* \
      && ldconfig \
      && apt-get install -y --no-install-recommends curl ca-certificates procps \
      && cd /tmp \
      && curl -fsSLO "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
      && tar -xf "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
      && cd aws-efa-installer \
      && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify \
      && ldconfig \
      && test -e /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so \
      && cd / && rm -rf /tmp/aws-efa-installer* /var/lib/apt/lists/*; \
    else \
      apt-get update && apt-get install -y --no-install-recommends procps && rm -rf /var/lib/apt/lists/*; \
    fi

# libfabric/EFA for NCCL; what holds on every instance type (AWS's NVRx sample for EKS): fork
# safety (data loader workers fork), NVLS off. GPUDirect RDMA (FI_EFA_USE_DEVICE_RDMA) depends on
# the instance type: the backend sets it per pod.
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${LD_LIBRARY_PATH} \
    PATH=/opt/amazon/efa/bin:${PATH} \
    OPAL_PREFIX= \
    NCCL_NET_PLUGIN=ofi \
    FI_EFA_FORK_SAFE=1 \
    RDMAV_FORK_SAFE=1 \
    NCCL_NVLS_ENABLE=0 \
    NCCL_DEBUG=WARN

RUN pip install "nvidia-resiliency-ext==${NVRX_VERSION}"

# ftplane's base install: the node side only (no web, database, queue or Kubernetes libraries).
COPY pyproject.toml README.md LICENSE /tmp/ftplane/
COPY api /tmp/ftplane/api
COPY workers /tmp/ftplane/workers
COPY migrations /tmp/ftplane/migrations
COPY ftplane /tmp/ftplane/ftplane
COPY trainer /tmp/ftplane/trainer
RUN pip install /tmp/ftplane && rm -rf /tmp/ftplane
ENV PYTHONUNBUFFERED=1

COPY deploy/docker/efa-check.sh /opt/ftplane/bin/efa-check

# Runs as the image's default user: the kubernetes backend sets the command
# (the node agent, which starts ft_launcher) and mounts /dev/shm and the checkpoint volume.
WORKDIR /workspace
ENTRYPOINT ["/opt/ftplane/bin/efa-check"]
CMD ["python", "-m", "ftplane.trainer", "--help"]
