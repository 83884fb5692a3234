"""`python3 login.py -m MODULE [ARGS...]`: runs a module of the image as `python3 -m` would,
with kafka-python's admin client defaulting to this pod's Kafka client settings, one
KAFKA_CLIENT_<NAME> variable per setting <name> (security_protocol, sasl_mechanism,
sasl_plain_username, sasl_plain_password, ssl_cafile, ssl_certfile, ssl_keyfile).

The admin CLI (directlog.admin.cli) and the scale-down hook (directlog.kube.scale_down)
take no client security settings of their own; the chart runs them through this file when
the INTERNAL listener is not PLAINTEXT (README.md, "Security").
"""

import os
import runpy
import sys

from kafka import KafkaAdminClient

PREFIX = "KAFKA_CLIENT_"

if len(sys.argv) < 3 or sys.argv[1] != "-m":
    sys.exit(f"usage: python3 {sys.argv[0]} -m MODULE [ARGS...]")
KafkaAdminClient.DEFAULT_CONFIG.update(
    (name[len(PREFIX) :].lower(), value)
    for name, value in os.environ.items()
    if name.startswith(PREFIX)
)
module = sys.argv[2]
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
