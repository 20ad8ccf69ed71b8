# The code-location image: the Dagster code location (definitions, assets, resources, sensors), the
# queue's run coordinator, the webserver and daemon, and the MLflow server, as the Helm values and
# deploy/kubernetes/mlflow.yaml run them. Build from the repository root:
#   docker build -f deploy/kubernetes/image/code-location.Dockerfile -t ghcr.io/training-platform/code-location:0.1.0 .
# Training itself runs in the training image (Dockerfile beside this one), launched as Kubernetes Jobs.
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# The CPU build of torch: the code location evaluates small models and reads checkpoints; GPUs are the
# training pods'. Every other version is the one constraints.txt pins (CI tests the same).
ARG TORCH_VERSION=2.13.0
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"

WORKDIR /opt/training-platform
COPY constraints.txt pyproject.toml README.md ./
COPY training_platform ./training_platform
COPY training_platform_dagster ./training_platform_dagster
COPY assets ./assets
COPY resources ./resources
COPY sensors ./sensors
COPY definitions.py ./
RUN pip install -c constraints.txt .

RUN useradd --uid 1000 --create-home dagster
USER 1000
EXPOSE 3030
# The Helm chart passes its own arguments (dagsterApiGrpcArgs); this default serves the code location.
CMD ["dagster", "api", "grpc", "-m", "definitions", "-h", "0.0.0.0", "-p", "3030"]
