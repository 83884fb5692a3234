#!/bin/sh
# apt-install PACKAGE...: Debian packages for an image build, without recommends and with no
# package lists left in the layer. When the build passes the host's CA bundle as the secret
# `ca` (RUN --mount=type=secret,id=ca,target=/run/secrets/ca,mode=0444), apt trusts it for an
# https mirror whose proxy re-signs it; the secret is a mount, never part of the layer.
set -eu
ca=/run/secrets/ca
export DEBIAN_FRONTEND=noninteractive
if [ -s "$ca" ]; then
    set -- -o "Acquire::https::CAInfo=$ca" "$@"
    apt-get -o "Acquire::https::CAInfo=$ca" update -qq
else
    apt-get update -qq
fi
apt-get install -y -qq --no-install-recommends "$@"
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log
