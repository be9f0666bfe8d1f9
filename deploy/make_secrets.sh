#!/usr/bin/env bash
# Make what docker-compose.tls.yml mounts: a self-signed certificate for the names `server`,
# `localhost` and 127.0.0.1 (it is its own CA: the client trusts server.pem), its key, and a
# file with one random bearer token.
#
#   deploy/make_secrets.sh [FOLDER]        # default: ./secrets (git-ignored)
#
# For anything beyond one machine use a certificate from your own CA and rotate the tokens
# (the token file may hold several, one a line; the server accepts any of them).
set -euo pipefail
folder="${1:-secrets}"
mkdir -p "$folder"
umask 027
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 365 \
    -subj "/CN=server" -addext "subjectAltName=DNS:server,DNS:localhost,IP:127.0.0.1" \
    -keyout "$folder/server.key" -out "$folder/server.pem" 2>/dev/null
{
    echo "# bearer tokens xattn-server accepts, one a line"
    openssl rand -hex 32
} > "$folder/tokens"
# the containers run as uid 1000 (XATTN_UID) and must read these bind-mounted files
chmod 0644 "$folder/server.pem"
chmod 0640 "$folder/server.key" "$folder/tokens"
echo "wrote $folder/server.pem, $folder/server.key, $folder/tokens"
