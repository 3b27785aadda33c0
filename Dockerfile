# syntax=docker/dockerfile:1
# The kubetrain operator image: `kubetrain operator ...` (the Helm chart passes the arguments).
#
#   docker build -t kubetrain/operator:0.1.0 .
#
# Layers, from the least to the most often changed: the user, the dependencies (keyed by pyproject.toml alone),
# then the project's sources installed with --no-deps, so that a code change rebuilds only that small last
# layer. One stage: no compiler is needed (every dependency ships a wheel), so a builder stage would only add
# a copy of the whole virtual environment to every rebuild. The image runs as a non-root user whose numeric
# UID matches the chart's runAsUser (65532).
# Pin the base by digest in release builds: --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:...
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kubetrain-operator" \
      org.opencontainers.image.description="Kubernetes operator for GPU training jobs (kopf)" \
      org.opencontainers.image.source="https://github.com/kubetrain/kubetrain" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 65532 kubetrain \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin kubetrain
ENV PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN python -m venv /opt/venv
WORKDIR /src
# The dependency list is read from pyproject.toml (the package's and its `operator` extra's), never repeated.
COPY pyproject.toml ./
RUN --mount=type=cache,target=/root/.cache/pip \
    python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
print("\n".join(p["dependencies"] + p["optional-dependencies"]["operator"]))' >requirements.txt \
    && pip install -r requirements.txt
# The distribution maps both packages; the trainer package is pure Python and its heavy dependencies live in
# the `trainer` extra, which is not installed here.
COPY README.md ./
# operator/kubetrain/core/crd.yaml is a link to this file; the wheel built below holds its contents.
COPY crds/trainingjobs.kubetrain.io.yaml crds/
COPY operator/ operator/
COPY trainer_image/kubetrain_trainer/ trainer_image/kubetrain_trainer/
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --no-deps . \
    && kubetrain --help >/dev/null
# Numeric user so that the kubelet can verify runAsNonRoot.
USER 65532:65532
WORKDIR /tmp
# 8080: Prometheus metrics; 8081: kopf liveness (/healthz).
EXPOSE 8080 8081
ENTRYPOINT ["kubetrain"]
CMD ["operator", "--all-namespaces"]
