"""Security shared by the services and clients: certificates, TLS contexts, SASL mechanisms,
the ACL model and principals (docs/security.md)."""
