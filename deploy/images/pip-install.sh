#!/bin/sh
# pip-install VENV ARG...: `VENV/bin/python -m pip install ARG...` inside an image build, with
# the build host's pip index settings (secret `pipconf`, a pip.conf) and CA bundle (secret
# `ca`) when the build passes them. Both are mounts under /run/secrets, never in a layer.
set -eu
venv=$1
shift
if [ -s /run/secrets/pipconf ]; then
    export PIP_CONFIG_FILE=/run/secrets/pipconf
fi
if [ -s /run/secrets/ca ]; then
    export PIP_CERT=/run/secrets/ca
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_WARN_SCRIPT_LOCATION=1
exec "$venv/bin/python" -m pip install --quiet "$@"
