"""Small helpers Directlog's pods run inside Kubernetes (the Helm chart's init containers)."""
