# syntax=docker/dockerfile:1
# The Cornus node image: `docker build -t cornus .` at the repository root.
#
# Two stages. `build` has the compilers: it installs the locked dependencies into a virtual
# environment (one without a wheel for the target platform compiles here), then a wheel of the
# project, and generates the protobuf code there, since the node's packages build it on
# first import and a read-only image (readOnlyRootFilesystem in the Helm chart) could not. The final
# stage copies only that environment: no compiler, no wheel cache, no source tree.

# Pinned by version: a rebuild gets the same Python. The same base in both stages, because the
# virtual environment's interpreter is a link to the base image's /usr/local/bin/python3.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
# bookworm's build-essential is 12.9 for the life of the release; the pin makes a drift visible.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential=12.9 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The dependencies first, exactly as locked (docker/requirements.lock, scripts/lock_image.sh):
# every version pinned and every file checked against its sha256, so a rebuild installs what was
# tested or fails; and this layer stays cached while only the project's own code changes.
COPY docker/requirements.lock /src/docker/requirements.lock
RUN python -m venv /opt/cornus \
    && /opt/cornus/bin/pip install --no-cache-dir --require-hashes -r /src/docker/requirements.lock
# Only what the wheel is made of (.dockerignore keeps the rest out of the context too).
COPY pyproject.toml README.md ./
COPY cornus ./cornus
COPY services ./services
COPY storage_adapters ./storage_adapters
COPY loadtests ./loadtests
# --no-deps: everything it needs is installed above; `pip check` fails the build if the lock no
# longer satisfies pyproject.toml. Importing the two protobuf packages generates their code
# (services/node_rpc/codegen.py); `python -P` keeps /src off sys.path, so that happens inside the
# installed packages, the ones the image ships, and the node finds it fresh and never writes at
# run time.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && /opt/cornus/bin/pip install --no-cache-dir --no-deps /wheels/cornus-*.whl \
    && /opt/cornus/bin/pip check \
    && /opt/cornus/bin/python -P -c "import services.node_rpc, services.public_api"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="cornus" \
      org.opencontainers.image.description="Cornus atomic commit middleware: one node (cornus serve)"
# HOME=/tmp: the root filesystem is read-only in the chart and /tmp is its one writable mount.
# No CORNUS_* setting: the node's variables override its --config file, so an image default would
# replace a mounted file's own (its listen addresses, a gRPC API it leaves off). The chart sets
# every address itself; `docker run` gives CORNUS_API_LISTEN (docs/deploy.md section 1).
ENV PATH=/opt/cornus/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# A fixed uid/gid, so Kubernetes' runAsUser/fsGroup (helm/cornus) name the same user.
RUN groupadd --system --gid 10001 cornus \
    && useradd --system --uid 10001 --gid cornus --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin cornus \
    && mkdir -p /var/lib/cornus \
    && chown cornus:cornus /var/lib/cornus
COPY --from=build /opt/cornus /opt/cornus
# The emulator backend's default file (cornus.db) lands here, in the working directory.
WORKDIR /var/lib/cornus
USER 10001:10001
# 7100 node-to-node stream, 8100 REST (/healthz, /readyz, /metrics), 9100 public gRPC.
EXPOSE 7100 8100 9100
# Liveness on the REST address the node's own configuration names, however it was given (a file,
# variables, flags): `cornus healthcheck` rebuilds it from the node's command line and environment
# (the node is PID 1), and asks on loopback when the node listens on every address. The start
# period covers a node that waits for its storage (services/serve.py STORAGE_OPEN_TIMEOUT_S, 60 s).
HEALTHCHECK --interval=10s --timeout=3s --start-period=90s --retries=3 \
    CMD ["cornus", "healthcheck"]
# No init before the node: the node is PID 1, so it would inherit any orphaned process and have to
# reap it. It starts one kind of process, the emulator backend's writer
# (storage_adapters/emulator_writer.py), as its own child, and reaps it itself when it exits; that
# writer runs in this container's cgroup and ends with it. `cornus serve` starts no other process.
ENTRYPOINT ["cornus"]
CMD ["serve"]
