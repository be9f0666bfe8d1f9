#!/usr/bin/env bash
# `make compose-check`: build the image and run the compose stack the way a user does, and
# check what the user would see (tests/test_compose_stack.py): the server healthy, the demo's
# sentence, the HTTP API for the `openai` SDK and /health, the inspector's page, a request
# in flight surviving `compose down`, the TLS override, the scale profile's balancer.
#
#   deploy/compose_check.sh                 # everything (the build is cached between runs)
#   deploy/compose_check.sh --build-only    # the base images and the image, no stack
#   deploy/compose_check.sh --fast          # ... and the image's own tests (what CI runs)
#   deploy/compose_check.sh -- -k tls       # pytest arguments after --
#
# It uses Docker where a Docker daemon answers, else Podman (rootful or rootless), and the
# compose tool beside it (`docker compose`, `docker-compose`, `podman-compose`; the last is
# installed into ~/.cache/xattn-compose-check when missing). What it cannot reach it makes:
# - no image registry: stand-ins for python:3.11-slim and haproxy:2.6 from Debian's packages
#   (deploy/local_bases.sh), passed as the Dockerfiles' PYTHON_IMAGE / HAPROXY_IMAGE;
# - no PyTorch CPU index: a CPU torch wheel from this machine (XATTN_TORCH_WHEEL, else one in
#   pip's find-links folders) and PyPI's torchaudio without its CUDA-linked extension, in
#   deploy/wheels/ (deploy/torch_wheels.py says why that is the same for xattn), with
#   TORCH_VERSION set to the wheel's version and the rest from PyPI. The log says which.
# Podman on a host that refuses to raise rlimits or to run crun in a hybrid cgroup tree gets
# a containers.conf of its own (CONTAINERS_CONF) with ulimits and a runtime that work.
# Environment: XATTN_PYTHON_IMAGE, XATTN_HAPROXY_IMAGE (bases to use as they are),
# XATTN_TORCH_WHEEL, XATTN_CHECK_ENGINE (docker or podman), PYTHON (default .venv/bin/python).
set -euo pipefail

# (a function: bash reads all of it before running, so an edit meanwhile cannot break a run)
main() {
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$(pwd)"
PYTHON="${PYTHON:-$root/.venv/bin/python}"
build_only=0
pytest_args=()
while (($#)); do
    case "$1" in
        --build-only) build_only=1 ;;
        --fast) pytest_args=(-k "test_image_ or broken_image") ;;  # the image, no stack but one server
        --) shift; pytest_args+=("$@"); break ;;
        *) echo "compose_check: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
say() { echo "compose-check: $*"; }
state="${XDG_CACHE_HOME:-$HOME/.cache}/xattn-compose-check"
mkdir -p "$state"

# --- the engine and its compose tool ---------------------------------------------------------
engine="${XATTN_CHECK_ENGINE:-}"
if [[ -z "$engine" ]]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        engine=docker
    elif command -v podman >/dev/null; then
        engine=podman
    else
        say "neither a Docker daemon nor podman here (apt-get install podman)" >&2
        exit 1
    fi
fi

conf="$state/containers.conf"
podman_conf() {
    # what this host lets a container have: crun, else runc; the default rlimits, else lower
    # ones (a sandbox may refuse to raise them); the first that runs `true` in $1
    local runtime n limits text
    if [[ -f "$conf" ]] && CONTAINERS_CONF="$conf" podman run --rm --net=none "$1" true \
        >/dev/null 2>&1; then
        return 0
    fi
    for runtime in "" runc; do
        [[ -n "$runtime" ]] && ! command -v "$runtime" >/dev/null && continue
        for n in "" 65536 32768 16384 4096; do
            limits=""
            [[ -n "$n" ]] && limits="default_ulimits = [\"nofile=$n:$n\", \"nproc=$n:$n\"]"
            text="[containers]"$'\n'"$limits"$'\n'"[engine]"
            [[ -n "$runtime" ]] && text+=$'\n'"runtime = \"$runtime\""
            printf '%s\n' "$text" > "$conf"
            if CONTAINERS_CONF="$conf" podman run --rm --net=none "$1" true >/dev/null 2>&1; then
                return 0
            fi
        done
    done
    rm -f "$conf"
    return 1
}

compose=()
if [[ "$engine" == docker ]]; then
    if docker compose version >/dev/null 2>&1; then
        compose=(docker compose)
    elif command -v docker-compose >/dev/null; then
        compose=(docker-compose)
    fi
else
    if command -v podman-compose >/dev/null; then
        compose=(podman-compose)
    else
        tools="$state/venv"
        if [[ ! -x "$tools/bin/podman-compose" ]]; then
            say "installing podman-compose into $tools"
            python3 -m venv "$tools"
            "$tools/bin/pip" install -q podman-compose==1.6.0
        fi
        compose=("$tools/bin/podman-compose")
    fi
fi
[[ ${#compose[@]} -gt 0 ]] || { say "no compose tool for $engine" >&2; exit 1; }
say "engine: $engine ($("$engine" --version | head -1)); compose: ${compose[*]}"

# --- base images ----------------------------------------------------------------------------
reachable() { curl -sS -m 15 -o /dev/null "$1" 2>/dev/null; }
registry=0
reachable https://registry-1.docker.io/v2/ && registry=1
((registry)) || say "no image registry: base images from Debian's packages (deploy/local_bases.sh)"
python_image="${XATTN_PYTHON_IMAGE:-}"
if [[ -z "$python_image" ]]; then
    if ((registry)); then
        python_image=python:3.11-slim
        "$engine" image inspect "$python_image" >/dev/null 2>&1 || "$engine" pull "$python_image"
    else
        python_image="$(deploy/local_bases.sh "$engine" python)"  # runs no container
    fi
fi
if [[ "$engine" == podman ]]; then
    # the Docker image format: OCI's has no HEALTHCHECK (podman would drop the image's)
    export BUILDAH_FORMAT=docker
    podman_conf "$python_image" || { say "podman runs no container here" >&2; exit 1; }
    export CONTAINERS_CONF="$conf"
    say "podman settings ($conf): $(grep -v '^\[' "$conf" | tr '\n' ' ')"
fi
haproxy_image="${XATTN_HAPROXY_IMAGE:-}"
if [[ -z "$haproxy_image" ]]; then
    if ((registry)); then
        haproxy_image=haproxy:2.6
    else
        haproxy_image="$(deploy/local_bases.sh "$engine" haproxy)"
    fi
fi
say "bases: $python_image, $haproxy_image"

# --- torch ----------------------------------------------------------------------------------
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
created="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
build_args=(--build-arg "PYTHON_IMAGE=$python_image" --build-arg "HAPROXY_IMAGE=$haproxy_image"
    --build-arg "VCS_REF=$revision" --build-arg "BUILD_DATE=$created")
if reachable https://download.pytorch.org/whl/cpu/torch/; then
    rm -f deploy/wheels/torch-*.whl deploy/wheels/torchaudio-*.whl
    say "torch: constraints.txt's versions from https://download.pytorch.org/whl/cpu"
else
    say "torch: PyTorch's CPU index is out of reach (deploy/torch_wheels.py):"
    args="$("$PYTHON" deploy/torch_wheels.py deploy/wheels)"
    for arg in $args; do build_args+=(--build-arg "$arg"); done
    say "  build arguments: $(echo $args); constraints.txt pins" \
        "$(grep -E '^torch(audio)?==' constraints.txt | tr '\n' ' ')"
fi

# --- the build -------------------------------------------------------------------------------
# one service a image: podman-compose would build xattn:local once for each service naming it,
# all at once
say "building: ${compose[*]} --profile scale build server balancer (cached layers are reused)"
start=$(date +%s)
"${compose[@]}" --profile scale build "${build_args[@]}" server balancer 2>&1 \
    | tee "$state/build.log" \
    | grep -E '^(\[[0-9]/[0-9]\] )?(STEP|Step|#[0-9]+ \[)|Successfully tagged|rror' || true
status=${PIPESTATUS[0]}
seconds=$(($(date +%s) - start))
((status == 0)) || { say "the build failed (log: $state/build.log)" >&2; exit "$status"; }
if [[ "$engine" == podman ]]; then
    # buildah reuses a cached LABEL step whatever its build arguments are: stamp this build's
    # commit and time on (a metadata-only layer; Docker's cache sees the arguments)
    local stamp
    stamp="$(mktemp -d)"
    printf 'FROM xattn:local\nLABEL org.opencontainers.image.revision="%s" org.opencontainers.image.created="%s"\n' \
        "$revision" "$created" > "$stamp/Dockerfile"
    podman build -q --no-cache -t xattn:local "$stamp" >/dev/null
    rm -rf "$stamp"
fi
say "build time: ${seconds} s"
size="$("$engine" image inspect xattn:local --format '{{.Size}}')"
say "image xattn:local: $((size / 1000000)) MB ($(numfmt --to=iec "$size" 2>/dev/null || echo "$size B"))"
"$engine" run --rm --read-only --entrypoint python xattn:local -c '
import importlib.metadata as m, os, pathlib, sys, torch
def du(p):
    return sum(f.stat().st_size for f in pathlib.Path(p).rglob("*") if f.is_file())
site = pathlib.Path(torch.__file__).parents[1]
big = sorted(((du(d), d.name) for d in site.iterdir() if d.is_dir()), reverse=True)[:8]
print("  python", sys.version.split()[0], "| torch", torch.__version__, "| venv",
      du("/opt/xattn") // 2**20, "MiB | site-packages:",
      ", ".join(f"{n} {s // 2**20}" for s, n in big), "MiB")
' || true
((build_only)) && exit 0

# --- the stack --------------------------------------------------------------------------------
export XATTN_COMPOSE_CHECK=1 XATTN_CHECK_ENGINE="$engine" XATTN_CHECK_COMPOSE="${compose[*]}"
export XATTN_CHECK_REVISION="$revision"
say "running tests/test_compose_stack.py"
local status=0 begun=$SECONDS
"$PYTHON" -m pytest -v -s -rs -p no:cacheprovider tests/test_compose_stack.py \
    "${pytest_args[@]}" || status=$?
say "build ${seconds} s, image $((size / 1000000)) MB, tests $((SECONDS - begun)) s:" \
    "$( ((status == 0)) && echo passed || echo "FAILED (pytest exit $status)")"
exit "$status"
}

main "$@"
