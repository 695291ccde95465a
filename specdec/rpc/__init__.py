"""gRPC plumbing shared by the router and the workers: generated stubs (v1/), the only
protobuf <-> dataclass conversion (convert.py; trees.py for the torch-side draft trees), the
exception -> status interceptor (status.py) and server start-up with health and reflection (server.py)."""
