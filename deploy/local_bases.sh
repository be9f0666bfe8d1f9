#!/usr/bin/env bash
# Stand-ins for the two registry images the Dockerfiles start from, built from Debian's
# packages, for a machine that reaches Debian's and Python's package archives but no image
# registry (deploy/compose_check.sh uses them there; with a registry, use the real ones):
#
#   deploy/local_bases.sh ENGINE python    # prints localhost/xattn-python:3.11-bookworm
#   deploy/local_bases.sh ENGINE haproxy   # prints localhost/xattn-haproxy:2.6-bookworm
#
# ENGINE is `podman` or `docker`. Each is built once (kept while the image exists).
# - python: what the Dockerfile needs of python:3.11-slim: Debian 12's Python 3.11 with venv
#   (ensurepip) and the `python` command, ca-certificates, useradd; made by mmdebstrap (apt
#   install mmdebstrap), imported with LANG=C.UTF-8. Where this host trusts a certificate
#   authority of its own (a TLS-inspecting proxy), its CA bundle goes in too, with PIP_CERT
#   pointing at it, so that pip in the build verifies the archives as the host does.
# - haproxy: what deploy/haproxy/Dockerfile needs of haproxy:2.6: Debian 12's HAProxy 2.6,
#   /usr/local/etc/haproxy/, the haproxy user, SIGUSR1 as its stop signal.
set -euo pipefail
engine="${1:?usage: local_bases.sh ENGINE python|haproxy}"
what="${2:?usage: local_bases.sh ENGINE python|haproxy}"
python_image=localhost/xattn-python:3.11-bookworm
haproxy_image=localhost/xattn-haproxy:2.6-bookworm
mirror="${XATTN_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
security="${XATTN_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}"

exists() { "$engine" image inspect "$1" >/dev/null 2>&1; }

python_base() {
    exists "$python_image" && return
    command -v mmdebstrap >/dev/null || { echo "local_bases: needs mmdebstrap" >&2; exit 1; }
    local tar hook=() env=(--change "ENV=LANG=C.UTF-8")
    tar="$(mktemp --suffix=.tar)"
    # shellcheck disable=SC2064
    trap "rm -f '$tar'" RETURN
    local bundle=/etc/ssl/certs/ca-certificates.crt
    if [[ -f "$bundle" ]]; then
        hook=(--customize-hook="cp $bundle \"\$1$bundle\"")
        env+=(--change "ENV=PIP_CERT=$bundle")
    fi
    echo "local_bases: building $python_image with mmdebstrap (a few minutes)" >&2
    mmdebstrap --quiet --variant=minbase \
        --include=python3.11,python3.11-venv,python-is-python3,ca-certificates,netbase,passwd \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
        "${hook[@]}" bookworm "$tar" \
        "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
        "deb $security bookworm-security main"
    "$engine" import "${env[@]}" --change 'CMD ["python3"]' "$tar" "$python_image" >/dev/null
}

haproxy_base() {
    exists "$haproxy_image" && return
    python_base
    echo "local_bases: building $haproxy_image (Debian's haproxy on $python_image)" >&2
    local context
    context="$(mktemp -d)"
    # shellcheck disable=SC2064
    trap "rm -rf '$context'" RETURN
    cat > "$context/Dockerfile" <<EOF
FROM $python_image
RUN apt-get update && apt-get install -y --no-install-recommends haproxy \\
    && apt-get clean && rm -rf /var/lib/apt/lists/* && mkdir -p /usr/local/etc/haproxy
USER haproxy
STOPSIGNAL SIGUSR1
CMD ["haproxy", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]
EOF
    "$engine" build -q -t "$haproxy_image" "$context" >/dev/null
}

case "$what" in
    python) python_base && echo "$python_image" ;;
    haproxy) haproxy_base && echo "$haproxy_image" ;;
    *) echo "local_bases: python or haproxy, not $what" >&2; exit 2 ;;
esac
