# syntax=docker/dockerfile:1
# The kubetrain operator image: `kubetrain operator ...` (the Helm chart passes the arguments).
#
#   docker build -t kubetrain/operator:0.1.0 .
#
# Two stages: the builder installs the package and its `operator` extra into a virtual environment; the
# runtime stage copies only that environment onto the same slim Python base, and runs as a non-root user
# whose numeric UID matches the chart's runAsUser (65532).
# Pin the base by digest in release builds: --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:...
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
# Sources the distribution needs (pyproject.toml maps both packages; the trainer package is pure Python
# and its heavy dependencies live in the `trainer` extra, which is not installed here).
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY trainer_image/kubetrain_trainer/ trainer_image/kubetrain_trainer/
RUN /opt/venv/bin/pip install --no-cache-dir ".[operator]" \
    && /opt/venv/bin/kubetrain --help >/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kubetrain-operator" \
      org.opencontainers.image.description="Kubernetes operator for GPU training jobs (kopf)" \
      org.opencontainers.image.source="https://github.com/kubetrain/kubetrain" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 65532 kubetrain \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin kubetrain
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Numeric user so that the kubelet can verify runAsNonRoot.
USER 65532:65532
WORKDIR /tmp
# 8080: Prometheus metrics; 8081: kopf liveness (/healthz).
EXPOSE 8080 8081
ENTRYPOINT ["kubetrain"]
CMD ["operator", "--all-namespaces"]
