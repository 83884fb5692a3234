"""gRPC contracts between services, generated from `proto/*.proto` by `make proto` (which
`make test` and `make run` run first); the generated modules are never edited or committed."""
