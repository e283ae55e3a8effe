# syntax=docker/dockerfile:1
# The ftplane control plane: one image for the API, the worker and beat
# (`ftplane serve --only api|worker|beat`, see deploy/kustomize). No PyTorch in it.
#
# Build from the repository root:
#   docker build -f deploy/docker/control-plane.Dockerfile -t ftplane-control-plane:0.1.0 .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY api ./api
COPY workers ./workers
COPY trainer ./trainer
COPY migrations ./migrations
COPY ftplane ./ftplane
RUN python -m venv /opt/ftplane \
 && /opt/ftplane/bin/pip install --upgrade pip \
 && /opt/ftplane/bin/pip install ".[server]"

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/ftplane/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    FTPLANE_HOST=0.0.0.0 \
    FTPLANE_DATA_DIR=/var/lib/ftplane
RUN groupadd --system --gid 10001 ftplane \
 && useradd --system --uid 10001 --gid ftplane --home-dir /var/lib/ftplane --create-home --shell /usr/sbin/nologin ftplane
COPY --from=build /opt/ftplane /opt/ftplane
USER 10001:10001
WORKDIR /var/lib/ftplane
EXPOSE 8000
ENTRYPOINT ["ftplane"]
CMD ["serve"]
