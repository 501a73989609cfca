# syntax=docker/dockerfile:1
# The planner controller image: `planner operator` by default, every `planner` command.
#
#   docker build -t <registry>/planner:0.1.0 .
#   helm install planner deploy/helm/planner --set image.repository=<registry>/planner
#
# CI cannot build images; .ci/run runs this file's install steps in a clean virtual
# environment instead (python -m tests.unit.deploy.dockerfile --emulate DIR).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ci-constraints.txt ./
COPY src ./src
# The same pins as CI; every dependency installs from a wheel (no compiler in the image). The
# bundled profiles are package data: `planner profile list` finds them with no variable set.
RUN python -m venv /opt/planner \
 && /opt/planner/bin/pip install --no-cache-dir --only-binary=:all: -c ci-constraints.txt . \
 && /opt/planner/bin/planner --version

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/planner/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
COPY --from=build /opt/planner /opt/planner
# A numeric non-root user (the chart's runAsUser); the root filesystem can be read-only.
USER 65532:65532
EXPOSE 9085
ENTRYPOINT ["planner"]
CMD ["operator", "--all-namespaces"]
